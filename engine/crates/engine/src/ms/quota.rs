//! Container quotas (the property `quota`, in bytes of data).
//!
//! Engines enforce them (an update past the quota fails with `EDQUOT`),
//! each target against its own count plus what the container holds
//! elsewhere; the service measures every container with a quota once a
//! second ([`QUOTA_EVERY`]) and tells every engine, and at once when the
//! property changes. Engines count stored bytes, replicas and parity
//! included; the property counts data, so the two are converted by the
//! container's file object class (`RP_2G1` stores two bytes per byte of
//! data, `EC_4P2G1` one and a half). Overwrites and removals count until
//! aggregation reclaims what they replaced; a target reclaims before it
//! would refuse an update and when this service finds the container within
//! an eighth of its quota (at most every 2 s), and when no client has used
//! it for 30 s. A
//! client retries an update refused for the quota for a few seconds
//! (`peregrine::object`'s `QUOTA_WAIT`), so room made by removing files on
//! other engines shows once they reclaimed and were measured again.

use super::{ContRec, MgmtService, MsState, PoolRec};
use peregrine_proto::mgmt::{ContShardQuota, ContShardQuotaReq, PoolShardSpace};
use peregrine_proto::size::parse_size;
use peregrine_proto::{ObjectClass, Redundancy};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tonic::Status;

/// How often the service measures containers with a quota.
pub const QUOTA_EVERY: Duration = Duration::from_secs(1);

/// The property's value in bytes; `None` for none.
pub(super) fn limit(c: &ContRec) -> Option<u64> {
    c.props.get("quota").and_then(|v| v.parse().ok())
}

/// Parse a `quota` value ("10GiB", bytes; "0" or "none" lifts it) into its
/// stored form (decimal bytes).
pub(super) fn parse(v: &str) -> Result<Option<String>, Status> {
    if v.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    match parse_size(v) {
        Ok(0) => Ok(None),
        Ok(n) => Ok(Some(n.to_string())),
        Err(e) => Err(Status::invalid_argument(format!(
            "container property quota={v:?}: {e}, or none"
        ))),
    }
}

/// Bytes stored per byte of data of the container's files: (stored, data).
fn stored_per_data(c: &ContRec) -> (u64, u64) {
    match c.oclass.parse::<ObjectClass>().map(|k| k.redundancy()) {
        Ok(Redundancy::Replicas(n)) => (n as u64, 1),
        Ok(Redundancy::ErasureCode { data, parity }) => ((data + parity) as u64, data as u64),
        _ => (1, 1),
    }
}

/// Stored bytes as bytes of data.
pub(super) fn data_bytes(c: &ContRec, stored: u64) -> u64 {
    let (s, d) = stored_per_data(c);
    (stored as u128 * d as u128 / s as u128) as u64
}

/// The quota as engines count it (stored bytes).
fn stored_limit(c: &ContRec, limit: u64) -> u64 {
    let (s, d) = stored_per_data(c);
    (limit as u128 * s as u128 / d as u128).min(u64::MAX as u128) as u64
}

impl MgmtService {
    /// Tell every running engine of the pool the quota of each of `conts`
    /// and what the container holds outside it (one call per engine); a
    /// container without a quota has it lifted. Engines that do not answer
    /// learn it next time.
    /// Count a quota change; call with the state lock held, after the change.
    pub(super) fn quota_changed(&self) -> u64 {
        self.quota_version.fetch_add(1, Ordering::SeqCst) + 1
    }

    pub(super) async fn push_quotas(
        &self,
        state: &MsState,
        pool: &PoolRec,
        conts: &[&ContRec],
        version: u64,
    ) {
        let spaces = self.shard_spaces(state, pool).await;
        let held = |c: &ContRec, s: &Option<PoolShardSpace>| {
            s.as_ref()
                .and_then(|s| s.cont_used.get(&c.uuid.to_string()).copied())
                .unwrap_or(0)
        };
        let totals: Vec<u64> = conts
            .iter()
            .map(|c| spaces.iter().map(|(_, s)| held(c, s)).sum())
            .collect();
        for (rank, space) in spaces.iter().filter(|r| r.1.is_some()) {
            let Ok(addr) = Self::member_addr(state, *rank) else {
                continue;
            };
            let quotas = conts
                .iter()
                .zip(&totals)
                .map(|(c, total)| ContShardQuota {
                    cont_uuid: c.uuid.to_string(),
                    limit: limit(c).map_or(0, |l| stored_limit(c, l).max(1)),
                    used_elsewhere: total - held(c, space),
                })
                .collect();
            let req = ContShardQuotaReq {
                pool_uuid: pool.uuid.to_string(),
                quotas,
                version,
            };
            let sent = match super::engine_client(&addr).await {
                Ok(mut e) => e.cont_shard_quota(req).await.map(|_| ()),
                Err(e) => Err(e),
            };
            if let Err(e) = sent {
                tracing::warn!(
                    "pool {}: container quotas not sent to rank {rank}: {}",
                    pool.label,
                    e.message()
                );
            }
        }
    }

    async fn push_all_quotas(&self) {
        // The state and the count of changes it holds, read together: a
        // push of this state must not undo a change made after it.
        let (state, version) = {
            let s = self.state.lock().await;
            (s.clone(), self.quota_version.load(Ordering::SeqCst))
        };
        for pool in state.pools.values() {
            let conts: Vec<&ContRec> = pool.conts.values().filter(|c| limit(c).is_some()).collect();
            if !conts.is_empty() {
                self.push_quotas(&state, pool, &conts, version).await;
            }
        }
    }
}

/// Measure and push container quotas for as long as the service runs.
pub fn spawn_quota_watch(ms: Arc<MgmtService>) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(QUOTA_EVERY).await;
            ms.push_all_quotas().await;
        }
    });
}
