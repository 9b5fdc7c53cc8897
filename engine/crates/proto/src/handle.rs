//! Pool and container handles: the capabilities the management service
//! issues at pool connect and container open, and every data-plane request
//! carries (`Address.handle`, docs/access-control.md).
//!
//! A handle is 37 bytes: its UUID (16), its rights (1), the version of the
//! pool key that made it (4, little-endian) and a MAC (16): HMAC-SHA256 with
//! the pool's key over a domain tag, the pool and container UUIDs (zeros
//! for a pool handle), the UUID, the rights and the key version, cut to 16
//! bytes. An engine that knows the pool's key checks it with one HMAC (and
//! remembers the handles it checked): no call to the management service,
//! no state per handle there. Eviction replaces the key (all handles) or
//! lists the handle as revoked.

use ring::hmac;
use uuid::Uuid;

/// Length of a handle on the wire.
pub const HANDLE_LEN: usize = 16 + 1 + 4 + MAC_LEN;
/// Length of a pool key.
pub const KEY_LEN: usize = 32;
const MAC_LEN: usize = 16;
const DOMAIN: &[u8] = b"peregrine handle v1\0";

/// What a handle allows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rights(u8);

impl Rights {
    pub const NONE: Rights = Rights(0);
    /// Fetch, list, query sizes.
    pub const READ: Rights = Rights(1);
    /// Update, punch.
    pub const WRITE: Rights = Rights(2);
    /// Every container of the pool, and the pool-wide requests of
    /// reintegration and transaction recovery: engines and admins only.
    pub const POOL_WIDE: Rights = Rights(4);
    const KNOWN: u8 = 7;

    pub fn contains(self, other: Rights) -> bool {
        self.0 & other.0 == other.0
    }
    pub fn union(self, other: Rights) -> Rights {
        Rights(self.0 | other.0)
    }
    pub fn bits(self) -> u8 {
        self.0
    }
}

impl std::fmt::Display for Rights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut any = false;
        for (bit, name) in [
            (Rights::READ, "read"),
            (Rights::WRITE, "write"),
            (Rights::POOL_WIDE, "pool-wide"),
        ] {
            if self.contains(bit) {
                write!(f, "{}{name}", if any { "+" } else { "" })?;
                any = true;
            }
        }
        if !any {
            write!(f, "none")?;
        }
        Ok(())
    }
}

/// A decoded handle (not yet checked: see [`Handle::verify`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle {
    pub id: [u8; 16],
    pub rights: Rights,
    pub key_version: u32,
    mac: [u8; MAC_LEN],
}

/// Why a handle was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandleError {
    /// The request carries none.
    Missing,
    /// Not [`HANDLE_LEN`] bytes, or rights this version does not know.
    Malformed(String),
}

impl std::fmt::Display for HandleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandleError::Missing => write!(
                f,
                "no handle: open the container (or connect to the pool) through the management service"
            ),
            HandleError::Malformed(why) => write!(f, "malformed handle: {why}"),
        }
    }
}

fn mac(
    key: &[u8],
    pool: &[u8; 16],
    cont: &[u8; 16],
    id: &[u8; 16],
    rights: Rights,
    key_version: u32,
) -> [u8; MAC_LEN] {
    let k = hmac::Key::new(hmac::HMAC_SHA256, key);
    let mut ctx = hmac::Context::with_key(&k);
    ctx.update(DOMAIN);
    ctx.update(pool);
    ctx.update(cont);
    ctx.update(id);
    ctx.update(&[rights.0]);
    ctx.update(&key_version.to_le_bytes());
    let tag = ctx.sign();
    let mut out = [0u8; MAC_LEN];
    out.copy_from_slice(&tag.as_ref()[..MAC_LEN]);
    out
}

/// The container UUID a pool handle is made for (and checked against).
pub const NO_CONT: [u8; 16] = [0; 16];

impl Handle {
    /// A new handle `id` of `pool` (and `cont`, or [`NO_CONT`] for a pool
    /// handle) with `rights`, made with version `key_version` of `key`.
    pub fn issue(
        key: &[u8],
        key_version: u32,
        pool: &Uuid,
        cont: &[u8; 16],
        id: Uuid,
        rights: Rights,
    ) -> Handle {
        let id = *id.as_bytes();
        Handle {
            id,
            rights,
            key_version,
            mac: mac(key, pool.as_bytes(), cont, &id, rights, key_version),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(HANDLE_LEN);
        v.extend_from_slice(&self.id);
        v.push(self.rights.0);
        v.extend_from_slice(&self.key_version.to_le_bytes());
        v.extend_from_slice(&self.mac);
        v
    }

    pub fn decode(b: &[u8]) -> Result<Handle, HandleError> {
        if b.is_empty() {
            return Err(HandleError::Missing);
        }
        if b.len() != HANDLE_LEN {
            return Err(HandleError::Malformed(format!(
                "{} bytes, want {HANDLE_LEN}",
                b.len()
            )));
        }
        let rights = b[16];
        if rights & !Rights::KNOWN != 0 {
            return Err(HandleError::Malformed(format!(
                "unknown rights {rights:#x}"
            )));
        }
        let mut h = Handle {
            id: [0; 16],
            rights: Rights(rights),
            key_version: u32::from_le_bytes([b[17], b[18], b[19], b[20]]),
            mac: [0; MAC_LEN],
        };
        h.id.copy_from_slice(&b[..16]);
        h.mac.copy_from_slice(&b[21..]);
        Ok(h)
    }

    /// Whether `key` made this handle for `pool` and `cont` (in constant
    /// time: a forger learns nothing from how long a refusal takes).
    pub fn verify(&self, key: &[u8], pool: &[u8; 16], cont: &[u8; 16]) -> bool {
        let want = mac(key, pool, cont, &self.id, self.rights, self.key_version);
        want.iter()
            .zip(self.mac.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }

    pub fn uuid(&self) -> Uuid {
        Uuid::from_bytes(self.id)
    }
}

/// A new random pool key.
pub fn new_key() -> Vec<u8> {
    let mut k = vec![0u8; KEY_LEN];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut k)
        .expect("the system's random source failed");
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_verifies_only_with_its_key_pool_container_and_bytes() {
        let key = new_key();
        let pool = Uuid::new_v4();
        let cont = *Uuid::new_v4().as_bytes();
        let h = Handle::issue(&key, 3, &pool, &cont, Uuid::new_v4(), Rights::READ);
        let wire = h.encode();
        assert_eq!(wire.len(), HANDLE_LEN);
        let d = Handle::decode(&wire).unwrap();
        assert_eq!(d, h);
        assert!(d.verify(&key, pool.as_bytes(), &cont));
        // Another key, pool or container.
        assert!(!d.verify(&new_key(), pool.as_bytes(), &cont));
        assert!(!d.verify(&key, Uuid::new_v4().as_bytes(), &cont));
        assert!(!d.verify(&key, pool.as_bytes(), &NO_CONT));
        // Any bit changed: rights raised, version, id, MAC.
        for i in 0..HANDLE_LEN {
            let mut w = wire.clone();
            w[i] ^= if i == 16 { 2 } else { 1 };
            if let Ok(x) = Handle::decode(&w) {
                assert!(!x.verify(&key, pool.as_bytes(), &cont), "byte {i}");
            }
        }
        assert_eq!(Handle::decode(&[]), Err(HandleError::Missing));
        assert!(matches!(
            Handle::decode(&wire[1..]),
            Err(HandleError::Malformed(_))
        ));
        let mut w = wire.clone();
        w[16] = 0x80;
        assert!(matches!(Handle::decode(&w), Err(HandleError::Malformed(_))));
        assert_eq!(Rights::READ.union(Rights::WRITE).to_string(), "read+write");
    }
}
