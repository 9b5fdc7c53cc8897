//! The control plane's mutual TLS and its roles (docs/tls.md), against real
//! engines: who is refused at the handshake, what each role may call, the
//! Join of an engine only as itself, and the insecure mode's explicit choice.

mod common;
use common::*;
use peregrine::certs::{admin_dir, engine_dir, generate, Plan};
use peregrine::tls::{CA_FILE, CERT_FILE, KEY_FILE};
use peregrine::{ObjectClass, ObjectId, Security};
use peregrine_proto::mgmt::*;
use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

fn join(rank: u32, system: &str) -> JoinReq {
    JoinReq {
        rank,
        uuid: uuid::Uuid::new_v4().to_string(),
        control_addr: "127.0.0.1:1".into(),
        data_addr: "127.0.0.1:2".into(),
        fault_domain: format!("/forged{rank}"),
        targets: 1,
        system: system.into(),
        state: "ready".into(),
        ..Default::default()
    }
}

fn denied<T: std::fmt::Debug>(r: Result<T, tonic::Status>, names: &[&str]) {
    let e = r.expect_err("allowed");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    for n in names {
        assert!(
            e.message().contains(n),
            "{:?} does not name {n}",
            e.message()
        );
    }
}

/// A TLS handshake with the engine trusting its CA, presenting no
/// certificate, then an HTTP/2 preface: the engine must refuse.
fn no_certificate_is_refused(c: &Cluster) {
    let mut roots = rustls::RootCertStore::empty();
    let ca = std::fs::read(c.admin_tls_dir().unwrap().join(CA_FILE)).unwrap();
    for cert in rustls_pemfile::certs(&mut &ca[..]) {
        roots.add(cert.unwrap()).unwrap();
    }
    let cfg = rustls::ClientConfig::builder_with_provider(peregrine::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(peregrine::tls::SERVER_NAME).unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(cfg), name).unwrap();
    let tcp = std::net::TcpStream::connect(c.mgmt_addr()).unwrap();
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut s = rustls::StreamOwned::new(conn, tcp);
    let wrote = s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    let mut b = [0u8; 64];
    let read = s.read(&mut b);
    assert!(
        wrote.is_err() || !matches!(read, Ok(n) if n > 0),
        "an engine answered a client without a certificate: {read:?}"
    );
}

/// A directory that trusts the engines' CA but holds `other`'s leaf.
fn hybrid(c: &Cluster, other: &Path, into: &Path) {
    std::fs::create_dir_all(into).unwrap();
    std::fs::copy(c.admin_tls_dir().unwrap().join(CA_FILE), into.join(CA_FILE)).unwrap();
    std::fs::copy(other.join(CERT_FILE), into.join(CERT_FILE)).unwrap();
    std::fs::copy(other.join(KEY_FILE), into.join(KEY_FILE)).unwrap();
}

/// Checks the engine's chain only (not its system), as a client of
/// another implementation might.
#[derive(Debug)]
struct ChainOnly(Arc<rustls::client::WebPkiServerVerifier>);

impl rustls::client::danger::ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        intermediates: &[rustls::pki_types::CertificateDer<'_>],
        name: &rustls::pki_types::ServerName<'_>,
        ocsp: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        self.0
            .verify_server_cert(end_entity, intermediates, name, ocsp, now)
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &rustls::pki_types::CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(m, c, d)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &rustls::pki_types::CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(m, c, d)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[derive(Clone)]
struct Connect(Arc<rustls::ClientConfig>);

type Io = hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;

impl tonic::codegen::Service<tonic::transport::Uri> for Connect {
    type Response = Io;
    type Error = std::io::Error;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<Io>> + Send>>;
    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn call(&mut self, uri: tonic::transport::Uri) -> Self::Future {
        let cfg = self.0.clone();
        Box::pin(async move {
            let addr = format!("{}:{}", uri.host().unwrap(), uri.port_u16().unwrap());
            let tcp = tokio::net::TcpStream::connect(addr).await?;
            let name = rustls::pki_types::ServerName::try_from(peregrine::tls::SERVER_NAME)
                .unwrap()
                .to_owned();
            let tls = tokio_rustls::TlsConnector::from(cfg)
                .connect(name, tcp)
                .await?;
            Ok(hyper_util::rt::TokioIo::new(tls))
        })
    }
}

/// A channel presenting the certificate of `dir`, checking only the
/// engine's chain.
async fn unchecked_channel(c: &Cluster, dir: &Path) -> tonic::transport::Channel {
    let files = peregrine::tls::TlsFiles::load(dir).unwrap();
    let provider = peregrine::tls::provider();
    let mut roots = rustls::RootCertStore::empty();
    let ca = std::fs::read(c.admin_tls_dir().unwrap().join(CA_FILE)).unwrap();
    for cert in rustls_pemfile::certs(&mut &ca[..]) {
        roots.add(cert.unwrap()).unwrap();
    }
    let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ChainOnly(inner)))
        .with_client_auth_cert(files.chain.clone(), files.key.clone_key())
        .unwrap();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    tonic::transport::Endpoint::from_shared(format!("http://{}", c.mgmt_addr()))
        .unwrap()
        .connect_with_connector(Connect(Arc::new(cfg)))
        .await
        .unwrap()
}

#[test]
fn strangers_are_refused_and_roles_are_kept() {
    let c = Cluster::start(ClusterSpec {
        engines: 2,
        targets: 1,
        ..Default::default()
    });
    let certs = c.certs.clone().unwrap();

    // No certificate at all; a plain (insecure) client.
    no_certificate_is_refused(&c);
    let plain = c.channel(&c.mgmt_addr(), &Security::Insecure);
    let refused = match plain {
        Err(_) => true,
        Ok(ch) => {
            let mut m = mgmt_client::MgmtClient::new(ch);
            c.rt.block_on(m.system_query(SystemQueryReq {})).is_err()
        }
    };
    assert!(refused, "a plain client was served");

    // A certificate of another CA: refused by the engine (the client side
    // trusts the engines' CA) and, the other way, the engine's certificate
    // is refused by a client trusting only the other CA.
    let tmp = tempfile::tempdir().unwrap();
    let other = tmp.path().join("other");
    generate(
        &other,
        &Plan {
            system: "test".into(),
            admin: true,
            ..Default::default()
        },
    )
    .unwrap();
    let forged = tmp.path().join("forged");
    hybrid(&c, &admin_dir(&other), &forged);
    let r = c
        .channel(&c.mgmt_addr(), &Security::tls(&forged))
        .and_then(|ch| {
            let mut m = mgmt_client::MgmtClient::new(ch);
            c.rt.block_on(m.pool_create(PoolCreateReq {
                label: "x".into(),
                total_size: 64 << 20,
                ..Default::default()
            }))
            .map_err(|e| e.to_string())
        });
    assert!(r.is_err(), "a certificate of another CA was served: {r:?}");
    let e = c
        .channel(&c.mgmt_addr(), &Security::tls(admin_dir(&other)))
        .expect_err("the engine's certificate passed another CA");
    assert!(e.contains("certificate"), "{e}");

    // The admin does everything.
    c.format();
    c.create_pool(128, "SX", "crc32c");
    let mut admin_engine = c.engine(1);
    c.rt.block_on(admin_engine.local_scan(Empty {})).unwrap();

    // A client: mount and I/O, nothing that changes the system.
    let mut m = c.mgmt_as(&c.client_security());
    denied(
        c.rt.block_on(m.pool_create(PoolCreateReq {
            label: "mine".into(),
            total_size: 64 << 20,
            ..Default::default()
        })),
        &["PoolCreate", "client"],
    );
    denied(
        c.rt.block_on(m.pool_destroy(PoolDestroyReq {
            id: "pool".into(),
            force: true,
        })),
        &["PoolDestroy", "client"],
    );
    denied(
        c.rt.block_on(m.storage_format(StorageFormatReq { force: true })),
        &["StorageFormat", "client"],
    );
    denied(
        c.rt.block_on(m.cont_destroy(ContDestroyReq {
            pool: "pool".into(),
            id: "cont".into(),
            ..Default::default()
        })),
        &["ContDestroy", "client"],
    );
    denied(c.rt.block_on(m.join(join(1, "test"))), &["Join", "client"]);
    let ch = c
        .channel(
            &format!("127.0.0.1:{}", c.engines[1].control_port),
            &c.client_security(),
        )
        .unwrap();
    let mut e = engine_client::EngineClient::new(ch);
    denied(
        c.rt.block_on(e.local_format(StorageFormatReq { force: true })),
        &["LocalFormat", "client"],
    );
    let client = peregrine::Client::connect(&c.mgmt_addr(), &c.client_security()).unwrap();
    let cont = client
        .pool_connect("pool")
        .unwrap()
        .cont_open("cont")
        .unwrap();
    let obj = cont.object(ObjectId::new(ObjectClass::S1, 0, 7)).unwrap();
    obj.update_single(b"d", b"a", b"by a client").unwrap();
    assert_eq!(
        obj.fetch_single(b"d", b"a").unwrap().as_deref(),
        Some(&b"by a client"[..])
    );
    let e = cont.snapshot("no").unwrap_err();
    assert_eq!(e.code, -libc::EACCES, "{e}");

    // An engine: only as itself, and not an admin.
    let mut m = c.mgmt_as(&Security::tls(engine_dir(&certs, 1)));
    denied(
        c.rt.block_on(m.join(join(0, "test"))),
        &["rank 0", "peregrine://test/engine/1"],
    );
    denied(
        c.rt.block_on(m.join(join(1, "other"))),
        &["\"other\"", "peregrine://test/engine/1"],
    );
    denied(
        c.rt.block_on(m.pool_destroy(PoolDestroyReq {
            id: "pool".into(),
            force: true,
        })),
        &["PoolDestroy", "engine"],
    );
    // A certificate of another system from the same CA: its holder refuses
    // these engines (not engines of its system) before saying anything.
    let foreign = tmp.path().join("foreign");
    generate(
        &foreign,
        &Plan {
            system: "elsewhere".into(),
            admin: true,
            ..Default::default()
        },
    )
    .unwrap();
    // Same CA: issue from the cluster's, into a directory of its own.
    let ca = peregrine::certs::Ca::load(&certs.join("ca")).unwrap();
    let id = peregrine::tls::Identity::new("elsewhere", peregrine::tls::Role::Admin, "admin");
    ca.issue_into(&admin_dir(&foreign), &id, &[]).unwrap();
    let e = c
        .channel(&c.mgmt_addr(), &Security::tls(admin_dir(&foreign)))
        .expect_err("a client of system elsewhere accepted an engine of system test");
    assert!(
        e.contains("\"elsewhere\"") && e.contains("peregrine://test/engine/0"),
        "{e}"
    );
    // The engine's side of it: an engine certificate of another system from
    // the same CA, presented by a client that does not check the server's
    // system, is refused on every call.
    ca.issue_into(
        &foreign.join("engine"),
        &peregrine::tls::Identity::new("elsewhere", peregrine::tls::Role::Engine, "1"),
        &[],
    )
    .unwrap();
    let ch =
        c.rt.block_on(unchecked_channel(&c, &foreign.join("engine")));
    let mut m = mgmt_client::MgmtClient::new(ch);
    denied(
        c.rt.block_on(m.system_query(SystemQueryReq {})),
        &["SystemQuery", "\"elsewhere\"", "\"test\""],
    );
    // Nothing of the above disturbed the system.
    c.wait_members(2, &[MemberState::Joined]);
    let info =
        c.rt.block_on(c.mgmt().pool_query(PoolQueryReq { id: "pool".into() }))
            .unwrap();
    assert_eq!(info.get_ref().label, "pool");
    assert!(c.engines[0].log_text().contains("control call refused"));
}

#[test]
fn insecure_is_an_explicit_choice_with_a_warning() {
    let c = Cluster::start_configured(ClusterSpec::default(), "allow_insecure: true\n");
    assert!(c.certs.is_none());
    c.format();
    let log = c.engines[0].log_text();
    assert!(
        log.contains("insecure: control plane without TLS"),
        "no warning in:\n{log}"
    );
    // Anyone may call: the choice was made.
    let mut m = c.mgmt_as(&Security::Insecure);
    c.rt.block_on(m.system_query(SystemQueryReq {})).unwrap();
    // Still: a Join without a system name is refused.
    let e = c.rt.block_on(m.join(join(7, ""))).unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(e.message().contains("system"), "{e}");
}

#[test]
fn an_engine_without_a_choice_or_with_another_rank_s_certificate_does_not_start() {
    let tmp = tempfile::tempdir().unwrap();
    let base = format!(
        "name: test\nrank: 0\ncontrol_port: {}\ndata_port: {}\ntargets: 1\nhugepages: false\n\
         scm: {{class: ram, size: 64MiB}}\nbdev: {{class: file, path: {}, size: 128MiB}}\n",
        free_port(),
        free_port(),
        tmp.path().join("nvme.img").display()
    );
    let run = |extra: &str| {
        let p = tmp.path().join("engine.yaml");
        std::fs::write(&p, format!("{base}{extra}")).unwrap();
        let out = Command::new(ENGINE_BIN)
            .arg("--config")
            .arg(&p)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run("");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("tls_dir") && err.contains("allow_insecure"),
        "{err}"
    );
    let certs = tmp.path().join("certs");
    generate(
        &certs,
        &Plan {
            system: "test".into(),
            ranks: 2,
            ..Default::default()
        },
    )
    .unwrap();
    let (code, err) = run(&format!("tls_dir: {}\n", engine_dir(&certs, 1).display()));
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("tls.crt") && err.contains("peregrine://test/engine/1"),
        "{err}"
    );
    let (code, err) = run(&format!(
        "tls_dir: {}\nallow_insecure: true\n",
        engine_dir(&certs, 0).display()
    ));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("not both"), "{err}");
    let (code, err) = run(&format!("tls_dir: {}\n", tmp.path().join("none").display()));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("ca.crt"), "{err}");
}
