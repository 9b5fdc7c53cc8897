//! Certificates for local use (`peregrine certs`, the test clusters, the
//! quickstart): a CA and leaf certificates in the layout of docs/tls.md.
//! In Kubernetes the operator makes and rotates them instead.
//!
//! ```text
//! OUT/ca/{ca.crt,ca.key}                      the CA (keep ca.key private)
//! OUT/engine-<rank>/{ca.crt,tls.crt,tls.key}  peregrine://<system>/engine/<rank>
//! OUT/admin/{ca.crt,tls.crt,tls.key}          peregrine://<system>/admin/admin
//! OUT/client-<name>/{ca.crt,tls.crt,tls.key}  peregrine://<system>/client/<name>
//! ```
//!
//! Keys are ECDSA P-256, written 0600. An existing `OUT/ca` is reused, so
//! running it again (say, for one more client) keeps every other
//! certificate valid.

use crate::tls::{valid_system_name, Identity, Role, CA_FILE, CERT_FILE, KEY_FILE, SERVER_NAME};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use time::{Duration, OffsetDateTime};

/// The CA's private key file, beside `ca.crt` in `OUT/ca`.
pub const CA_KEY_FILE: &str = "ca.key";
/// How long a generated CA is valid.
pub const CA_DAYS: i64 = 3650;
/// How long a generated leaf is valid.
pub const LEAF_DAYS: i64 = 365;

/// A CA able to issue leaf certificates.
pub struct Ca {
    /// The CA certificate as issuer (re-made from `ca.crt` when loaded:
    /// same name and key, so what it signs chains to the file's certificate).
    cert: rcgen::Certificate,
    key: KeyPair,
    /// `ca.crt` as written or read.
    pub pem: String,
}

fn err(what: impl std::fmt::Display, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

/// Leaf validity starts an hour back: clocks of hosts differ a little.
fn validity(days: i64) -> (OffsetDateTime, OffsetDateTime) {
    let now = OffsetDateTime::now_utc();
    (now - Duration::hours(1), now + Duration::days(days))
}

impl Ca {
    /// A new self-signed CA for `system`.
    pub fn generate(system: &str) -> Result<Ca, String> {
        let key =
            KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|e| err("CA key", e))?;
        let mut p = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, format!("peregrine CA {system}"));
        dn.push(DnType::OrganizationName, "peregrine");
        p.distinguished_name = dn;
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        (p.not_before, p.not_after) = validity(CA_DAYS);
        let cert = p.self_signed(&key).map_err(|e| err("CA certificate", e))?;
        let pem = cert.pem();
        Ok(Ca { cert, key, pem })
    }

    /// The CA of `dir` (`ca.crt`, `ca.key`).
    pub fn load(dir: &Path) -> Result<Ca, String> {
        let (cp, kp) = (dir.join(CA_FILE), dir.join(CA_KEY_FILE));
        let pem = std::fs::read_to_string(&cp).map_err(|e| err(cp.display(), e))?;
        let key_pem = std::fs::read_to_string(&kp).map_err(|e| err(kp.display(), e))?;
        let key = KeyPair::from_pem(&key_pem).map_err(|e| err(kp.display(), e))?;
        let params = CertificateParams::from_ca_cert_pem(&pem).map_err(|e| err(cp.display(), e))?;
        let cert = params
            .self_signed(&key)
            .map_err(|e| err(format!("{} with {}", cp.display(), kp.display()), e))?;
        if cert.der().is_empty() {
            return Err(format!("{}: empty", cp.display()));
        }
        Ok(Ca { cert, key, pem })
    }

    /// Write `ca.crt` and `ca.key` (0600) into `dir`.
    pub fn write(&self, dir: &Path) -> Result<(), String> {
        std::fs::create_dir_all(dir).map_err(|e| err(dir.display(), e))?;
        write_file(&dir.join(CA_FILE), self.pem.as_bytes(), 0o644)?;
        write_file(
            &dir.join(CA_KEY_FILE),
            self.key.serialize_pem().as_bytes(),
            0o600,
        )
    }

    /// Issue a leaf for `id`: engines get the DNS SAN [`SERVER_NAME`] (plus
    /// `hosts`, names or IPs) and serve and call (serverAuth, clientAuth);
    /// the others only call (clientAuth).
    pub fn issue(&self, id: &Identity, hosts: &[String]) -> Result<Leaf, String> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(|e| err(format!("key of {id}"), e))?;
        let mut p = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, id.uri());
        dn.push(DnType::OrganizationName, "peregrine");
        p.distinguished_name = dn;
        let uri = id
            .uri()
            .try_into()
            .map_err(|e| err(format!("URI SAN {id}"), e))?;
        p.subject_alt_names = vec![SanType::URI(uri)];
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.use_authority_key_identifier_extension = true;
        if id.role == Role::Engine {
            let mut names = vec![SERVER_NAME.to_string()];
            names.extend(hosts.iter().cloned());
            for h in names {
                let san = match h.parse::<std::net::IpAddr>() {
                    Ok(ip) => SanType::IpAddress(ip),
                    Err(_) => SanType::DnsName(
                        h.as_str()
                            .try_into()
                            .map_err(|e| err(format!("host name {h:?}"), e))?,
                    ),
                };
                p.subject_alt_names.push(san);
            }
            p.extended_key_usages = vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ];
        } else {
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        }
        (p.not_before, p.not_after) = validity(LEAF_DAYS);
        let cert = p
            .signed_by(&key, &self.cert, &self.key)
            .map_err(|e| err(format!("certificate of {id}"), e))?;
        Ok(Leaf {
            identity: id.clone(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Issue a leaf for `id` and write it with `ca.crt` into `dir`.
    pub fn issue_into(&self, dir: &Path, id: &Identity, hosts: &[String]) -> Result<(), String> {
        self.issue(id, hosts)?.write(dir, &self.pem)
    }
}

/// A leaf certificate and its key (PEM, PKCS#8).
pub struct Leaf {
    pub identity: Identity,
    pub cert_pem: String,
    pub key_pem: String,
}

impl Leaf {
    /// Write `ca.crt`, `tls.crt` and `tls.key` (0600) into `dir`.
    pub fn write(&self, dir: &Path, ca_pem: &str) -> Result<(), String> {
        std::fs::create_dir_all(dir).map_err(|e| err(dir.display(), e))?;
        write_file(&dir.join(CA_FILE), ca_pem.as_bytes(), 0o644)?;
        write_file(&dir.join(CERT_FILE), self.cert_pem.as_bytes(), 0o644)?;
        write_file(&dir.join(KEY_FILE), self.key_pem.as_bytes(), 0o600)
    }
}

/// Write a file with `mode`, also when it exists already with another one.
fn write_file(p: &Path, data: &[u8], mode: u32) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(mode)
        .open(p)
        .map_err(|e| err(p.display(), e))?;
    f.set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(|e| err(p.display(), e))?;
    f.write_all(data).map_err(|e| err(p.display(), e))
}

/// What `peregrine certs` makes.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub system: String,
    /// Engine certificates for ranks 0..ranks.
    pub ranks: u32,
    /// An `admin` certificate (name "admin").
    pub admin: bool,
    /// `client` certificates of these names.
    pub clients: Vec<String>,
    /// Extra DNS names or IPs of the engine certificates.
    pub hosts: Vec<String>,
}

/// The directory of rank `rank`'s certificate under `out`.
pub fn engine_dir(out: &Path, rank: u32) -> PathBuf {
    out.join(format!("engine-{rank}"))
}

/// The directory of the admin certificate under `out`.
pub fn admin_dir(out: &Path) -> PathBuf {
    out.join("admin")
}

/// The directory of client `name`'s certificate under `out`.
pub fn client_dir(out: &Path, name: &str) -> PathBuf {
    out.join(format!("client-{name}"))
}

/// Make (or reuse) `out/ca` and the leaves of `plan`; returns the
/// directories written, the CA's first.
pub fn generate(out: &Path, plan: &Plan) -> Result<Vec<PathBuf>, String> {
    if !valid_system_name(&plan.system) {
        return Err(format!(
            "--system {:?}: must be 1-64 characters of [A-Za-z0-9_-] (the engines' `name`)",
            plan.system
        ));
    }
    for c in &plan.clients {
        Identity::parse(&Identity::new(&plan.system, Role::Client, c).uri())
            .map_err(|e| format!("--client {c:?}: {e}"))?;
        if c.contains(['/', '\\']) || c.starts_with('.') {
            return Err(format!("--client {c:?}: not usable as a directory name"));
        }
    }
    let ca_dir = out.join("ca");
    let ca = if ca_dir.join(CA_FILE).exists() || ca_dir.join(CA_KEY_FILE).exists() {
        Ca::load(&ca_dir)?
    } else {
        let ca = Ca::generate(&plan.system)?;
        ca.write(&ca_dir)?;
        ca
    };
    let mut written = vec![ca_dir];
    for rank in 0..plan.ranks {
        let d = engine_dir(out, rank);
        let id = Identity::new(&plan.system, Role::Engine, &rank.to_string());
        ca.issue_into(&d, &id, &plan.hosts)?;
        written.push(d);
    }
    if plan.admin {
        let d = admin_dir(out);
        ca.issue_into(&d, &Identity::new(&plan.system, Role::Admin, "admin"), &[])?;
        written.push(d);
    }
    for c in &plan.clients {
        let d = client_dir(out, c);
        ca.issue_into(&d, &Identity::new(&plan.system, Role::Client, c), &[])?;
        written.push(d);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::TlsFiles;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn generated_dirs_load_with_their_identities_and_private_keys() {
        let out = tempfile::tempdir().unwrap();
        let plan = Plan {
            system: "tank".into(),
            ranks: 2,
            admin: true,
            clients: vec!["fuse".into()],
            hosts: vec!["node1".into(), "10.0.0.1".into()],
        };
        let dirs = generate(out.path(), &plan).unwrap();
        assert_eq!(dirs.len(), 5);
        let f = TlsFiles::load(&engine_dir(out.path(), 1)).unwrap();
        assert_eq!(f.identity, Identity::new("tank", Role::Engine, "1"));
        let f = TlsFiles::load(&admin_dir(out.path())).unwrap();
        assert_eq!(f.identity.role, Role::Admin);
        let f = TlsFiles::load(&client_dir(out.path(), "fuse")).unwrap();
        assert_eq!(f.identity.uri(), "peregrine://tank/client/fuse");
        for p in [
            out.path().join("ca/ca.key"),
            engine_dir(out.path(), 0).join(KEY_FILE),
        ] {
            let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", p.display());
        }
        // Again, for one more client: the CA stays, the old leaves still chain.
        let ca_before = std::fs::read(out.path().join("ca/ca.crt")).unwrap();
        let more = Plan {
            system: "tank".into(),
            clients: vec!["csi".into()],
            ..Default::default()
        };
        generate(out.path(), &more).unwrap();
        assert_eq!(
            std::fs::read(out.path().join("ca/ca.crt")).unwrap(),
            ca_before
        );
        let csi = TlsFiles::load(&client_dir(out.path(), "csi")).unwrap();
        assert_eq!(csi.ca_pem, ca_before);
    }

    #[test]
    fn a_bad_system_or_client_name_is_refused() {
        let out = tempfile::tempdir().unwrap();
        let e = generate(out.path(), &Plan::default()).unwrap_err();
        assert!(e.contains("--system"), "{e}");
        let plan = Plan {
            system: "tank".into(),
            clients: vec!["../x".into()],
            ..Default::default()
        };
        let e = generate(out.path(), &plan).unwrap_err();
        assert!(e.contains("--client"), "{e}");
    }

    #[test]
    fn a_key_of_another_certificate_is_named() {
        let out = tempfile::tempdir().unwrap();
        let plan = Plan {
            system: "tank".into(),
            ranks: 2,
            ..Default::default()
        };
        generate(out.path(), &plan).unwrap();
        std::fs::copy(
            engine_dir(out.path(), 1).join(KEY_FILE),
            engine_dir(out.path(), 0).join(KEY_FILE),
        )
        .unwrap();
        let e = TlsFiles::load(&engine_dir(out.path(), 0)).err().unwrap();
        assert!(
            e.contains("tls.key") && e.contains("is not the key of"),
            "{e}"
        );
    }
}
