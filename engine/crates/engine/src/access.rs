//! Access checks on the data plane (docs/access-control.md): every request
//! carries the handle its client got at container open (or pool connect),
//! and this engine checks it with the pool's key before the request goes
//! to its target, on both transports.
//!
//! What a request needs:
//! - fetch, list, size query: a read handle of its container;
//! - update, punch: a write handle of its container;
//! - flush, a transaction's decision or query: a handle of the pool;
//! - the pool-wide listings of reintegration and transaction recovery: a
//!   pool-wide handle (engines and admins).
//!
//! A pool-wide handle counts as a handle of every container of its pool.
//! The management service pushes each pool's key and revoked handles with
//! the pool map (so an engine knows them from its first heartbeat, before
//! it serves anything, and from the pool's creation on); an eviction
//! replaces the key or lists the handle, and every handle checked since
//! is checked again.
//!
//! The check costs one HMAC the first time a thread meets a handle; after
//! that a lookup among the handles the thread checked (each client process
//! has its own handle, so a thread serving a job of hundreds of ranks sees
//! hundreds of them: `cargo bench -p peregrine-engine --bench
//! access_check` gives about 15 ns for a lookup and 640 ns for an HMAC
//! here, against about 13 us of engine time per request at the fastest
//! data-plane line).

use crate::request::DataRequest as Request;
use parking_lot::RwLock;
use peregrine_proto::data::Address;
use peregrine_proto::handle::{Handle, Rights, HANDLE_LEN, KEY_LEN, NO_CONT};
use peregrine_proto::mgmt::PoolAccess;
use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use uuid::Uuid;

/// Why a request may not run: an errno and a message for the client.
pub type Refusal = (i32, String);

/// What a request needs of its handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Need {
    /// A handle of the request's container with these rights.
    Container(Rights),
    /// A handle of the pool (any container's will not do: it names none).
    Pool,
    /// A pool-wide handle.
    PoolWide,
}

fn need(req: &Request) -> Need {
    match req {
        Request::Fetch(_) | Request::List(_) | Request::QuerySize(_) => {
            Need::Container(Rights::READ)
        }
        Request::Update(..) | Request::Punch(_) => Need::Container(Rights::WRITE),
        Request::Flush(_) | Request::DtxDecide(_) | Request::DtxQuery(_) => Need::Pool,
        Request::ListChanged(_) | Request::ListRecords(_) => Need::PoolWide,
    }
}

/// One pool's key and revoked handles.
struct PoolKeys {
    key: Vec<u8>,
    version: u32,
    revoked: Vec<[u8; 16]>,
}

/// The pools' keys this engine checks handles with.
pub struct Access {
    enabled: bool,
    pools: RwLock<HashMap<Uuid, PoolKeys>>,
    /// Bumped by every change of a key or revocation list: handles checked
    /// before are checked again.
    generation: AtomicU64,
}

/// A handle a thread checked: its bytes, the pool and container it was
/// checked for, under which generation.
#[derive(Clone, Copy)]
struct Checked {
    handle: [u8; HANDLE_LEN],
    pool: [u8; 16],
    cont: [u8; 16],
    rights: Rights,
    generation: u64,
}

/// Handles each thread remembers (about 100 bytes each); past that it
/// starts over.
const CHECKED_PER_THREAD: usize = 4096;

/// Handles a thread checked, by the first 8 bytes of their random id. Only
/// handles that verified are entered, so a client cannot choose ids that
/// collide: the id's own bytes are a good enough hash.
type CheckedMap = HashMap<u64, Checked, BuildHasherDefault<IdHash>>;

thread_local! {
    static CHECKED: RefCell<CheckedMap> = RefCell::new(CheckedMap::default());
}

/// The hash of a key that is already random (see [`CheckedMap`]).
#[derive(Default)]
struct IdHash(u64);

impl Hasher for IdHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// The key of a handle's bytes in [`CheckedMap`].
fn id_key(handle: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(handle.get(..8)?.try_into().ok()?))
}

fn bytes16(v: &[u8]) -> Option<[u8; 16]> {
    v.try_into().ok()
}

impl Access {
    /// Checks on (`enabled`) or off (every request runs, as before handles).
    pub fn new(enabled: bool) -> Access {
        Access {
            enabled,
            pools: RwLock::new(HashMap::new()),
            generation: AtomicU64::new(1),
        }
    }

    /// Take a pool's key and revocations as the management service sent
    /// them. An older key version than the one known is ignored.
    pub fn install(&self, pool: Uuid, a: &PoolAccess) -> Result<(), String> {
        if a.key.len() != KEY_LEN {
            return Err(format!(
                "pool {pool}: access key of {} bytes, want {KEY_LEN}",
                a.key.len()
            ));
        }
        let revoked = a
            .revoked
            .iter()
            .map(|r| {
                bytes16(r)
                    .ok_or_else(|| format!("pool {pool}: revoked handle of {} bytes", r.len()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut pools = self.pools.write();
        if let Some(k) = pools.get(&pool) {
            let same = k.version == a.key_version && k.key == a.key && k.revoked == revoked;
            if same || k.version > a.key_version {
                return Ok(());
            }
        }
        pools.insert(
            pool,
            PoolKeys {
                key: a.key.clone(),
                version: a.key_version,
                revoked,
            },
        );
        self.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Forget a destroyed pool's key.
    pub fn remove(&self, pool: &Uuid) {
        if self.pools.write().remove(pool).is_some() {
            self.generation.fetch_add(1, Ordering::Release);
        }
    }

    /// Whether `req`'s handle lets it run.
    pub fn check(&self, req: &Request) -> Result<(), Refusal> {
        if !self.enabled {
            return Ok(());
        }
        let Some(addr) = req.addr() else {
            return Err((-libc::EINVAL, "request without an address".into()));
        };
        self.check_addr(addr, need(req))
    }

    fn check_addr(&self, addr: &Address, need: Need) -> Result<(), Refusal> {
        let pool = bytes16(&addr.pool).ok_or_else(|| {
            (
                -libc::EINVAL,
                format!("pool of {} bytes in the address, want 16", addr.pool.len()),
            )
        })?;
        let cont = match need {
            Need::Container(_) => bytes16(&addr.cont).ok_or_else(|| {
                (
                    -libc::EINVAL,
                    format!(
                        "container of {} bytes in the address, want 16",
                        addr.cont.len()
                    ),
                )
            })?,
            // A pool-level request may name its container (a flush does):
            // then that container's handle serves.
            Need::Pool => bytes16(&addr.cont).unwrap_or(NO_CONT),
            Need::PoolWide => NO_CONT,
        };
        let generation = self.generation.load(Ordering::Acquire);
        let key = id_key(&addr.handle);
        let hit = key.and_then(|key| {
            CHECKED.with(|c| {
                c.borrow().get(&key).and_then(|k| {
                    (k.generation == generation
                        && k.handle[..] == addr.handle[..]
                        && k.pool == pool
                        && (k.cont == cont || k.rights.contains(Rights::POOL_WIDE)))
                    .then_some(k.rights)
                })
            })
        });
        let rights = match hit {
            Some(r) => r,
            None => {
                let (rights, checked_for) = self.verify(addr, &pool, &cont)?;
                CHECKED.with(|c| {
                    let mut c = c.borrow_mut();
                    let entry = Checked {
                        handle: addr.handle[..].try_into().expect("verified: HANDLE_LEN"),
                        pool,
                        cont: checked_for,
                        rights,
                        generation,
                    };
                    if c.len() >= CHECKED_PER_THREAD {
                        c.clear();
                    }
                    c.insert(id_key(&entry.handle).expect("verified: HANDLE_LEN"), entry);
                });
                rights
            }
        };
        let ok = match need {
            Need::Container(r) => rights.contains(r),
            Need::Pool => true,
            Need::PoolWide => rights.contains(Rights::POOL_WIDE),
        };
        if ok {
            return Ok(());
        }
        Err((
            -libc::EACCES,
            match need {
                Need::Container(r) if r == Rights::WRITE => {
                    format!("handle {} is read-only: the container was opened without write access", Handle::decode(&addr.handle).map(|h| h.uuid()).unwrap_or_default())
                }
                _ => format!("handle grants {rights}: this request needs a pool-wide handle (engines and admins)"),
            },
        ))
    }

    /// The rights of `addr`'s handle, checked with the pool's key, and the
    /// container it was checked for ([`NO_CONT`] for a pool handle).
    fn verify(
        &self,
        addr: &Address,
        pool: &[u8; 16],
        cont: &[u8; 16],
    ) -> Result<(Rights, [u8; 16]), Refusal> {
        let h = Handle::decode(&addr.handle).map_err(|e| (-libc::EACCES, e.to_string()))?;
        let pools = self.pools.read();
        let pu = Uuid::from_bytes(*pool);
        let Some(k) = pools.get(&pu) else {
            return Err((
                -libc::EACCES,
                format!("pool {pu}: this engine holds no key for it (not a pool of this engine, or destroyed)"),
            ));
        };
        if h.key_version != k.version {
            return Err((
                -libc::EACCES,
                format!("handle {} was evicted (pool key version {}, the pool's is {}): open the container again", h.uuid(), h.key_version, k.version),
            ));
        }
        if k.revoked.contains(&h.id) {
            return Err((-libc::EACCES, format!("handle {} was evicted", h.uuid())));
        }
        // A pool-wide handle is made for no container; any other for its own.
        let checked_for = if h.rights.contains(Rights::POOL_WIDE) {
            NO_CONT
        } else {
            *cont
        };
        if !h.verify(&k.key, pool, &checked_for) {
            return Err((
                -libc::EACCES,
                if checked_for == NO_CONT && *cont != NO_CONT {
                    "handle not valid for this pool (forged, or from another pool)".to_string()
                } else {
                    format!(
                        "handle not valid for {} (forged, or of another container or pool)",
                        if *cont == NO_CONT {
                            "the pool"
                        } else {
                            "this container"
                        }
                    )
                },
            ));
        }
        Ok((h.rights, checked_for))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use peregrine_proto::data::FetchReq;
    use peregrine_proto::handle::new_key;

    fn addr(pool: &Uuid, cont: &Uuid, handle: &Handle) -> Option<Address> {
        Some(Address {
            pool: pool.as_bytes().to_vec(),
            cont: cont.as_bytes().to_vec(),
            handle: handle.encode(),
            ..Default::default()
        })
    }

    fn fetch(pool: &Uuid, cont: &Uuid, handle: &Handle) -> Request {
        Request::Fetch(FetchReq {
            addr: addr(pool, cont, handle),
            ..Default::default()
        })
    }

    fn keys(key: &[u8], version: u32, revoked: Vec<Vec<u8>>) -> PoolAccess {
        PoolAccess {
            key: key.to_vec(),
            key_version: version,
            revoked,
        }
    }

    /// What a thread remembers never lets through what a fresh check would
    /// refuse: another container, a revoked handle, an old key version.
    #[test]
    fn remembered_handles_are_refused_once_they_would_be() {
        let (pool, key) = (Uuid::new_v4(), new_key());
        let a = Access::new(true);
        a.install(pool, &keys(&key, 1, vec![])).unwrap();
        // Far more handles than the 8 the cache once held, in turn, twice.
        let conts: Vec<(Uuid, Handle)> = (0..100)
            .map(|_| {
                let c = Uuid::new_v4();
                let id = Uuid::new_v4();
                (
                    c,
                    Handle::issue(&key, 1, &pool, c.as_bytes(), id, Rights::READ),
                )
            })
            .collect();
        for _ in 0..2 {
            for (c, h) in &conts {
                a.check(&fetch(&pool, c, h)).unwrap();
            }
        }
        let (c0, h0) = &conts[0];
        // Another container with a remembered handle.
        let e = a.check(&fetch(&pool, &conts[1].0, h0)).unwrap_err();
        assert_eq!(e.0, -libc::EACCES, "{}", e.1);
        // A write with a remembered read handle.
        let upd = Request::Update(
            peregrine_proto::data::UpdateReq {
                addr: addr(&pool, c0, h0),
                ..Default::default()
            },
            peregrine_vos::Bulk::Owned(Vec::new()),
        );
        assert_eq!(a.check(&upd).unwrap_err().0, -libc::EACCES);
        // Revoked while remembered: that handle alone.
        let (c1, h1) = &conts[1];
        a.install(pool, &keys(&key, 1, vec![h1.uuid().as_bytes().to_vec()]))
            .unwrap();
        assert_eq!(a.check(&fetch(&pool, c1, h1)).unwrap_err().0, -libc::EACCES);
        a.check(&fetch(&pool, c0, h0)).unwrap();
        // A new key version evicts every handle of the old one.
        a.install(pool, &keys(&new_key(), 2, vec![])).unwrap();
        assert_eq!(a.check(&fetch(&pool, c0, h0)).unwrap_err().0, -libc::EACCES);
    }
}
