//! What this engine knows of the pool maps: per pool, the map version and
//! the state of its own targets in it (as the management service pushes
//! them, and as every heartbeat reply repeats them).
//!
//! Contract with the clients (see the client library's object module):
//! - A request made with a pool map older than the one this engine knows is
//!   refused with `-ESTALE` before anything is stored, so the client
//!   refreshes its map and retries. The management service tells every live
//!   engine of a new version before it acts on it (reintegration starts only
//!   once they all answered), so an update that skips a target the system
//!   counts in can no longer be acknowledged.
//! - A target that is not up-and-in serves no reads (`-ESTALE`): after an
//!   outage its shards may be stale until reintegration brings them up to
//!   date; a reintegrating target (`TARGET_UP`) takes updates.
//! - Until the first heartbeat reply, after a start, the engine does not
//!   know whether it was excluded while it was away: it serves nothing
//!   (`-EAGAIN`; clients retry).
//!
//! Admission and a version change are ordered by one lock: a request is
//! checked and handed to its target under the read lock, a new version is
//! installed under the write lock, and [`PoolMaps::install`]'s caller then
//! drains every target, so the answer to a push means that nothing admitted
//! under an older version is still unapplied.

use crate::access::Access;
use crate::request::DataRequest as Request;
use parking_lot::{RwLock, RwLockReadGuard};
use peregrine_proto::mgmt::{PoolMapVersion, TargetState};
use std::collections::HashMap;
use uuid::Uuid;

/// This engine's view of one pool map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolView {
    pub version: u64,
    pub state: TargetState,
    /// While a target of the pool is out: aggregation runs up to this
    /// epoch at most (see `PoolMapVersion.aggregation_cap`).
    pub aggregation_cap: Option<u64>,
}

pub struct PoolMaps {
    /// `None` until the management service answered a heartbeat.
    known: RwLock<Option<HashMap<Uuid, PoolView>>>,
    /// The pools' keys: what a request's handle is checked with.
    pub access: Access,
}

impl Default for PoolMaps {
    /// Without access checks.
    fn default() -> PoolMaps {
        PoolMaps::new(Access::new(false))
    }
}

pub use crate::access::Refusal;

/// Whether a request reads shard contents (a target that is not up-and-in
/// must not answer those) or changes them. A record listing (epochs and
/// extents, no data) is answered by a reintegrating target too: the copy
/// asks it what it holds already, so as not to write that again.
fn reads(req: &Request) -> bool {
    matches!(
        req,
        Request::Fetch(_) | Request::List(_) | Request::QuerySize(_) | Request::ListChanged(_)
    )
}

impl PoolMaps {
    pub fn new(access: Access) -> PoolMaps {
        PoolMaps {
            known: RwLock::new(None),
            access,
        }
    }

    /// Admit `req` or say why not. Hold the returned guard until the
    /// request is handed to its target.
    pub fn admit(
        &self,
        req: &Request,
    ) -> Result<RwLockReadGuard<'_, Option<HashMap<Uuid, PoolView>>>, Refusal> {
        let guard = self.known.read();
        let Some(known) = guard.as_ref() else {
            return Err((
                -libc::EAGAIN,
                "engine is starting: it has not heard from the management service yet".into(),
            ));
        };
        // Its handle first: whatever the map, a request without the right
        // to run learns nothing else of the pool.
        self.access.check(req)?;
        // A malformed address is the target's to reject, with its own message.
        let Some(addr) = req.addr() else {
            return Ok(guard);
        };
        // A transaction's outcome reaching a shard, or a question about it,
        // is not an update: whatever this engine's state or map, it must be
        // able to learn and tell what was decided. The prepares, which
        // decide (committed once all prepared), are held to the map.
        if matches!(req, Request::DtxDecide(_) | Request::DtxQuery(_)) {
            return Ok(guard);
        }
        let (pool, version) = (&addr.pool, addr.map_version);
        let Some(view) = Uuid::from_slice(pool).ok().and_then(|p| known.get(&p)) else {
            // A pool created after the last heartbeat: nothing of it was missed.
            return Ok(guard);
        };
        if version < view.version {
            return Err((
                -libc::ESTALE,
                format!(
                    "pool map version {version} is stale: this engine has version {}",
                    view.version
                ),
            ));
        }
        match view.state {
            TargetState::TargetUpIn => Ok(guard),
            TargetState::TargetUp if !reads(req) => Ok(guard),
            TargetState::TargetUp => Err((
                -libc::ESTALE,
                format!(
                    "this engine's targets are being reintegrated (pool map version {}): no reads yet",
                    view.version
                ),
            )),
            TargetState::TargetDown | TargetState::TargetDownOut => Err((
                -libc::ESTALE,
                format!(
                    "this engine's targets are excluded from the pool (map version {})",
                    view.version
                ),
            )),
        }
    }

    /// Install one pool's view; an older version than the one known is
    /// ignored. Returns whether anything changed.
    pub fn install(&self, m: &PoolMapVersion) -> Result<bool, String> {
        let pool = Uuid::parse_str(&m.pool_uuid)
            .map_err(|_| format!("pool map: pool {:?} is not a UUID", m.pool_uuid))?;
        let state = TargetState::try_from(m.state)
            .map_err(|_| format!("pool map of pool {pool}: unknown target state {}", m.state))?;
        if let Some(a) = &m.access {
            self.access.install(pool, a)?;
        }
        let mut guard = self.known.write();
        let known = guard.get_or_insert_with(HashMap::new);
        let new = PoolView {
            version: m.version,
            state,
            aggregation_cap: (m.aggregation_cap != 0).then_some(m.aggregation_cap),
        };
        match known.get(&pool) {
            Some(v) if v.version > new.version || *v == new => Ok(false),
            _ => {
                known.insert(pool, new);
                Ok(true)
            }
        }
    }

    /// Install every pool of a heartbeat reply (the engine now knows where
    /// it stands). Pools it no longer appears in are forgotten.
    pub fn install_all(&self, maps: &[PoolMapVersion]) -> Result<bool, String> {
        let mut changed = self.known.read().is_none();
        let mut keep = Vec::with_capacity(maps.len());
        for m in maps {
            changed |= self.install(m)?;
            keep.push(Uuid::parse_str(&m.pool_uuid).expect("checked by install"));
        }
        let mut guard = self.known.write();
        let known = guard.get_or_insert_with(HashMap::new);
        let before = known.len();
        known.retain(|p, _| keep.contains(p));
        Ok(changed || known.len() != before)
    }

    /// Serve everything as before pool maps were pushed (a management
    /// service that does not send them).
    pub fn open_all(&self) {
        self.known.write().get_or_insert_with(HashMap::new);
    }

    /// The aggregation cap of every pool known.
    pub fn aggregation_caps(&self) -> Vec<(Uuid, Option<u64>)> {
        self.known
            .read()
            .iter()
            .flatten()
            .map(|(p, v)| (*p, v.aggregation_cap))
            .collect()
    }

    /// Every pool's view (none before the first heartbeat reply).
    pub fn views(&self) -> Vec<(Uuid, PoolView)> {
        self.known
            .read()
            .iter()
            .flatten()
            .map(|(p, v)| (*p, *v))
            .collect()
    }

    pub fn view(&self, pool: &Uuid) -> Option<PoolView> {
        self.known.read().as_ref()?.get(pool).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use peregrine_proto::data;

    fn fetch(pool: Uuid, version: u64) -> Request {
        Request::Fetch(data::FetchReq {
            addr: Some(data::Address {
                pool: pool.as_bytes().to_vec(),
                map_version: version,
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn punch(pool: Uuid, version: u64) -> Request {
        Request::Punch(data::PunchReq {
            addr: Some(data::Address {
                pool: pool.as_bytes().to_vec(),
                map_version: version,
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn view(pool: Uuid, version: u64, state: TargetState) -> PoolMapVersion {
        PoolMapVersion {
            pool_uuid: pool.to_string(),
            version,
            state: state as i32,
            aggregation_cap: 0,
            ..Default::default()
        }
    }

    #[test]
    fn nothing_is_served_before_the_first_heartbeat() {
        let m = PoolMaps::default();
        let e = m.admit(&fetch(Uuid::new_v4(), 1)).unwrap_err();
        assert_eq!(e.0, -libc::EAGAIN);
        m.install_all(&[]).unwrap();
        assert!(m.admit(&fetch(Uuid::new_v4(), 1)).is_ok());
    }

    #[test]
    fn stale_versions_and_states_refused() {
        let (m, p) = (PoolMaps::default(), Uuid::new_v4());
        m.install_all(&[view(p, 3, TargetState::TargetUpIn)])
            .unwrap();
        assert_eq!(m.admit(&punch(p, 2)).unwrap_err().0, -libc::ESTALE);
        assert!(m.admit(&punch(p, 3)).is_ok());
        assert!(m.admit(&fetch(p, 4)).is_ok(), "a newer client map is fine");
        m.install(&view(p, 4, TargetState::TargetUp)).unwrap();
        assert!(m.admit(&punch(p, 4)).is_ok(), "reintegrating takes writes");
        assert_eq!(m.admit(&fetch(p, 4)).unwrap_err().0, -libc::ESTALE);
        let records = Request::ListRecords(data::ListRecordsReq {
            addr: Some(data::Address {
                pool: p.as_bytes().to_vec(),
                map_version: 4,
                ..Default::default()
            }),
            ..Default::default()
        });
        assert!(
            m.admit(&records).is_ok(),
            "reintegration asks what it holds already"
        );
        m.install(&view(p, 5, TargetState::TargetDown)).unwrap();
        assert_eq!(m.admit(&punch(p, 5)).unwrap_err().0, -libc::ESTALE);
        // An older push arriving late changes nothing.
        assert!(!m.install(&view(p, 4, TargetState::TargetUpIn)).unwrap());
        assert_eq!(m.view(&p).unwrap().version, 5);
    }
}
