//! Who may connect to a pool and open a container (the ACL properties),
//! the handles the service issues for it, and eviction
//! (docs/access-control.md).
//!
//! The caller's identity: an `admin` or `engine` certificate is trusted
//! with everything (the operator, the CSI controller, the CLI as admin,
//! engines' own clients). A `client` certificate is a node's credential:
//! its holder (the FUSE daemon, the CSI node plugin) acts for the local
//! user it names in the request's [`Credential`], which it took from the
//! kernel. On an insecure system every caller is believed, and one that
//! names no user is trusted with everything, as before ACLs existed.

use super::PoolRec;
use crate::auth::Caller;
use peregrine::tls::Role;
use peregrine_proto::acl::{self, Acl, Perms, Who};
use peregrine_proto::handle::{self, Handle, Rights, NO_CONT};
use peregrine_proto::mgmt::{Credential, PoolAccess};
use std::collections::{BTreeMap, HashMap};
use tonic::Status;
use uuid::Uuid;

/// Handles revoked one by one a pool keeps at most: one more replaces the
/// pool's key instead, which ends every handle (clients open again).
pub(super) const MAX_REVOKED: usize = 1024;
/// Owner and owner group of what was made without naming them, by a
/// caller that named no user.
const DEFAULT_OWNER: &str = "root";
/// Most groups a credential may list.
const MAX_GROUPS: usize = 256;

/// A pool's first access key.
pub(super) fn new_access() -> PoolAccess {
    PoolAccess {
        key: handle::new_key(),
        key_version: 1,
        revoked: vec![],
    }
}

/// For whom a call acts.
#[derive(Clone, Debug)]
pub(super) enum Requester {
    /// An admin or engine certificate, or an insecure caller naming no user.
    Trusted,
    User(Credential),
}

impl Requester {
    /// The requester of a call with extensions `ext` and credential `cred`.
    pub(super) fn of(ext: &tonic::Extensions, cred: Option<Credential>) -> Result<Self, Status> {
        let role = ext
            .get::<Caller>()
            .and_then(|c| c.0.as_ref())
            .map(|id| id.role);
        match (role, cred) {
            (Some(Role::Admin | Role::Engine), _) | (None, None) => Ok(Requester::Trusted),
            (Some(Role::Client), None) => Err(Status::permission_denied(
                "a client certificate acts for a user: the request names none (credential missing)",
            )),
            (_, Some(c)) => {
                check_credential(&c)?;
                Ok(Requester::User(c))
            }
        }
    }

    fn perms(&self, props: &BTreeMap<String, String>) -> Perms {
        match self {
            Requester::Trusted => Perms::ALL,
            Requester::User(c) => {
                // Stored ACLs were checked when set; one that no longer
                // parses grants nothing rather than everything.
                let acl = Acl::parse(props.get("acl").map_or(acl::DEFAULT_ACL, String::as_str))
                    .unwrap_or_default();
                acl.perms(
                    &Who {
                        user: &c.user,
                        uid: c.uid,
                        groups: &c.groups,
                    },
                    props.get("owner").map_or(DEFAULT_OWNER, String::as_str),
                    props.get("group").map_or(DEFAULT_OWNER, String::as_str),
                )
            }
        }
    }

    fn name(&self) -> String {
        match self {
            Requester::Trusted => "a trusted caller".into(),
            Requester::User(c) => format!("user {}@ (uid {})", c.user, c.uid),
        }
    }
}

fn check_credential(c: &Credential) -> Result<(), Status> {
    let bad = |why: String| Status::invalid_argument(format!("credential: {why}"));
    acl::parse_name(&c.user).map_err(|e| bad(format!("user: {e}")))?;
    if c.groups.len() > MAX_GROUPS {
        return Err(bad(format!(
            "{} groups: at most {MAX_GROUPS}",
            c.groups.len()
        )));
    }
    for g in &c.groups {
        acl::parse_name(g).map_err(|e| bad(format!("group: {e}")))?;
    }
    Ok(())
}

/// Check the access properties among `props` (`acl`, `owner`, `group`)
/// of a pool or container (`what`).
pub(super) fn validate_props(what: &str, props: &HashMap<String, String>) -> Result<(), Status> {
    for (k, v) in props {
        let r = match k.as_str() {
            "acl" => Acl::parse(v).map(drop),
            "owner" | "group" => acl::parse_name(v).map(drop),
            _ => Ok(()),
        };
        r.map_err(|e| Status::invalid_argument(format!("{what} property {k}: {e}")))?;
    }
    Ok(())
}

/// `props` with the access properties stored the way they are read: the
/// ACL re-written, names without their `@`; the creator `cred` as owner
/// and owner group when it names a user and they are not given.
pub(super) fn normalize_props(props: &mut BTreeMap<String, String>, cred: Option<&Credential>) {
    if let Some(c) = cred {
        props
            .entry("owner".into())
            .or_insert_with(|| c.user.clone());
        if let Some(g) = c.groups.first() {
            props.entry("group".into()).or_insert_with(|| g.clone());
        }
    }
    for k in ["owner", "group"] {
        if let Some(v) = props.get_mut(k) {
            *v = v.trim_end_matches('@').to_string();
        }
    }
    if let Some(Ok(a)) = props.get("acl").map(|v| Acl::parse(v)) {
        props.insert("acl".into(), a.to_string());
    }
}

fn refused(who: &Requester, need: &str, what: String) -> Status {
    Status::permission_denied(format!(
        "{} may not {need} {what}: its ACL does not grant it (see `peregrine {} get-acl`)",
        who.name(),
        if what.starts_with("pool") {
            "pool"
        } else {
            "cont"
        }
    ))
}

/// The pool handle of `who` on `p`, which needs read on the pool.
pub(super) fn pool_handle(p: &PoolRec, who: &Requester) -> Result<Vec<u8>, Status> {
    let perms = who.perms(&p.props);
    if !perms.contains(Perms::READ) {
        return Err(refused(who, "connect to", format!("pool {:?}", p.label)));
    }
    let mut rights = Rights::READ;
    if perms.contains(Perms::WRITE) {
        rights = rights.union(Rights::WRITE);
    }
    if matches!(who, Requester::Trusted) {
        rights = rights.union(Rights::POOL_WIDE);
    }
    Ok(issue(&p.access, &p.uuid, &NO_CONT, rights))
}

/// The container handle of `who` on container `cont` of `p`: read on the
/// pool and the container; writes if the container's ACL grants them and
/// `read_only` does not refuse them.
pub(super) fn cont_handle(
    p: &PoolRec,
    cont: &Uuid,
    who: &Requester,
    read_only: bool,
) -> Result<Vec<u8>, Status> {
    let c = &p.conts[cont];
    if matches!(who, Requester::Trusted) {
        // Engines and admins: one handle for every container of the pool.
        return pool_handle(p, who);
    }
    let what = || format!("container {:?} of pool {:?}", c.label, p.label);
    if !who.perms(&p.props).contains(Perms::READ) {
        return Err(refused(who, "connect to", format!("pool {:?}", p.label)));
    }
    let perms = who.perms(&c.props);
    if !perms.contains(Perms::READ) {
        return Err(refused(who, "open", what()));
    }
    let mut rights = Rights::READ;
    if perms.contains(Perms::WRITE) && !read_only {
        rights = rights.union(Rights::WRITE);
    }
    Ok(issue(&p.access, &p.uuid, cont.as_bytes(), rights))
}

fn issue(a: &PoolAccess, pool: &Uuid, cont: &[u8; 16], rights: Rights) -> Vec<u8> {
    Handle::issue(&a.key, a.key_version, pool, cont, Uuid::new_v4(), rights).encode()
}

/// End handle `h` of a pool (or every handle, `h` empty); says what was done.
pub(super) fn evict(a: &mut PoolAccess, h: &[u8]) -> Result<String, Status> {
    if !h.is_empty() && h.len() != 16 {
        return Err(Status::invalid_argument(format!(
            "handle of {} bytes: want a 16-byte UUID (or none: every handle)",
            h.len()
        )));
    }
    if h.is_empty() || a.revoked.len() >= MAX_REVOKED {
        *a = PoolAccess {
            key: handle::new_key(),
            key_version: a.key_version.wrapping_add(1).max(1),
            revoked: vec![],
        };
        return Ok(if h.is_empty() {
            "every handle evicted (new pool key)".into()
        } else {
            format!("{MAX_REVOKED} handles revoked already: every handle evicted (new pool key)")
        });
    }
    if !a.revoked.iter().any(|r| r == h) {
        a.revoked.push(h.to_vec());
    }
    Ok(format!(
        "handle {} evicted",
        Uuid::from_slice(h).unwrap_or_default()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cred(user: &str, uid: u32, groups: &[&str]) -> Credential {
        Credential {
            uid,
            gid: uid,
            user: user.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }

    #[test]
    fn eviction_revokes_one_then_rotates_when_full() {
        let mut a = new_access();
        let id = *Uuid::new_v4().as_bytes();
        assert!(evict(&mut a, &id).unwrap().contains("evicted"));
        assert_eq!(a.revoked.len(), 1);
        assert!(evict(&mut a, &[1, 2]).is_err());
        let before = a.key.clone();
        evict(&mut a, &[]).unwrap();
        assert_eq!(a.key_version, 2);
        assert_ne!(a.key, before);
        assert!(a.revoked.is_empty());
        for _ in 0..MAX_REVOKED {
            evict(&mut a, Uuid::new_v4().as_bytes()).unwrap();
        }
        assert!(evict(&mut a, Uuid::new_v4().as_bytes())
            .unwrap()
            .contains("new pool key"));
        assert_eq!(a.key_version, 3);
    }

    #[test]
    fn props_are_checked_and_owned_by_the_creator() {
        let mut p: HashMap<String, String> = HashMap::new();
        p.insert("acl".into(), "A::bob@:rq".into());
        let e = validate_props("pool", &p).unwrap_err();
        assert!(e.message().contains("pool property acl"), "{e}");
        p.insert("acl".into(), "A::bob@:rw".into());
        p.insert("owner".into(), "bad name@".into());
        assert!(validate_props("container", &p).is_err());
        let mut stored: BTreeMap<String, String> = BTreeMap::new();
        stored.insert("acl".into(), " A::bob@:rw ,A::EVERYONE@:r".into());
        normalize_props(&mut stored, Some(&cred("ann", 5, &["eng", "x"])));
        assert_eq!(stored["owner"], "ann");
        assert_eq!(stored["group"], "eng");
        assert_eq!(stored["acl"], "A::bob@:rw,A::EVERYONE@:r");
        let r = Requester::User(cred("bob", 6, &[]));
        assert_eq!(r.perms(&stored), Perms::READ.union(Perms::WRITE));
        let eve = Requester::User(cred("eve", 7, &[]));
        assert_eq!(eve.perms(&stored), Perms::READ);
        // No ACL: the default, the owner may do all, others nothing.
        let mut plain = BTreeMap::new();
        normalize_props(&mut plain, Some(&cred("ann", 5, &["eng"])));
        assert_eq!(
            Requester::User(cred("ann", 5, &[])).perms(&plain),
            Perms::ALL
        );
        assert!(eve.perms(&plain).is_empty());
        assert_eq!(Requester::Trusted.perms(&plain), Perms::ALL);
    }
}
