//! Pool maps: the state of each rank's targets in each pool, failure
//! detection, and reintegration of engines that come back.
//!
//! States (as DAOS's pool map), per rank and pool; absent means up-and-in:
//!
//! ```text
//!   UP_IN --no heartbeat for HEARTBEAT_TIMEOUT--> DOWN     (since := horizon)
//!   DOWN  --joins again with its storage open-->  UP       (takes writes, serves no reads)
//!   UP    --every dkey changed since `since` copied or reconstructed--> UP_IN
//!   UP    --stops answering again-->              DOWN     (keeps the older `since`)
//! ```
//!
//! Every change raises the pool's map version and is persisted before any
//! engine hears of it. Engines refuse requests made with an older map
//! (`crate::poolmap`), and clients never skip a target their map counts in
//! (they wait and refresh), so an update that skipped a target is
//! acknowledged only under a map in which that target is down: the
//! reintegration that follows copies it. Reintegration starts only once
//! every live engine of the pool has answered the push of the map that
//! makes the returning target writable: from then on no update can skip
//! it, and the copy covers everything before.
//!
//! While a rank is out, every engine of the pool aggregates only up to the
//! oldest `since` (aggregation drops a punch once nothing is left below it,
//! and the copy would miss it). A rank out longer than the engine config's
//! `reintegration_window_s` stops holding aggregation back (`full`): when it
//! returns, its pool shards are wiped while it is still DOWN, and the copy
//! starts from epoch 0 (everything visible).
//!
//! `since` is an epoch below every update the target may have missed: the
//! time of its last heartbeat less [`REINTEGRATION_MARGIN`], which covers a
//! client's retries of one update (epochs are chosen once, before the first
//! try, and a client retries for at most `peregrine::object::RETRY_WINDOW`)
//! and clock skew between nodes.

use super::{engine_client, MgmtService, MsState, PoolRec, HEARTBEAT_TIMEOUT};
use peregrine_proto::epoch_now;
use peregrine_proto::mgmt::{
    PoolMapVersion, PoolShardCreateReq, PoolShardDestroyReq, RankTargetState, TargetState,
};
use peregrine_proto::ms::EngineState;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// How far below a lost engine's last heartbeat reintegration starts
/// copying (see the module docs).
pub const REINTEGRATION_MARGIN: Duration = Duration::from_secs(90);
/// How often the pool watch looks at heartbeats and reintegrations.
const WATCH_EVERY: Duration = Duration::from_millis(500);
/// How long a pool whose reintegration failed waits before the next try.
const RETRY_AFTER: Duration = Duration::from_secs(3);
/// How long one engine gets to take a new pool map (it drains its targets).
const PUSH_TIMEOUT: Duration = Duration::from_secs(10);

/// A state other than up-and-in, as persisted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OutState {
    Down,
    /// Back, being reintegrated.
    Up,
    /// Down and rebuilt elsewhere (rebuild does not exist yet).
    DownOut,
}

/// A rank whose targets are not up-and-in in one pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RankOut {
    pub(super) state: OutState,
    /// Reintegration copies what changed above this epoch.
    pub(super) since: u64,
    /// Out longer than the reintegration window: aggregation is no longer
    /// held back for it, and it returns wiped, for a whole copy.
    pub(super) full: bool,
}

/// A pool's reintegration: running, or failed at the given time.
pub(crate) enum Reintegration {
    Running,
    Failed(Instant),
}

pub(super) fn target_state(s: &MsState, pool: &Uuid, rank: u32) -> TargetState {
    match s.pool_out.get(pool).and_then(|o| o.get(&rank)) {
        None => TargetState::TargetUpIn,
        Some(o) => match o.state {
            OutState::Down => TargetState::TargetDown,
            OutState::Up => TargetState::TargetUp,
            OutState::DownOut => TargetState::TargetDownOut,
        },
    }
}

/// What an engine needs of every pool it is part of.
pub(super) fn views_of_rank(s: &MsState, rank: u32) -> Vec<PoolMapVersion> {
    s.pools
        .values()
        .filter(|p| p.ranks.contains(&rank))
        .map(|p| view(s, p, rank))
        .collect()
}

fn view(s: &MsState, p: &PoolRec, rank: u32) -> PoolMapVersion {
    PoolMapVersion {
        pool_uuid: p.uuid.to_string(),
        version: p.map_version,
        state: target_state(s, &p.uuid, rank).into(),
        // 0 means no cap on the wire: a rank copied whole (`since` 0) caps
        // aggregation at epoch 1, so every version its copy reads stays.
        aggregation_cap: s
            .pool_out
            .get(&p.uuid)
            .and_then(|o| o.values().filter(|r| !r.full).map(|r| r.since.max(1)).min())
            .unwrap_or(0),
        access: Some(p.access.clone()),
    }
}

fn rank_targets(p: &PoolRec, rank: u32) -> u32 {
    p.ranks
        .iter()
        .position(|&r| r == rank)
        .and_then(|i| p.targets.get(i).copied())
        .unwrap_or(1)
}

/// Targets of `rank` not up-and-in, over all its pools.
pub(super) fn targets_out(s: &MsState, rank: u32) -> u32 {
    s.pools
        .values()
        .filter(|p| {
            s.pool_out
                .get(&p.uuid)
                .is_some_and(|o| o.contains_key(&rank))
        })
        .map(|p| rank_targets(p, rank))
        .sum()
}

/// A pool's targets that are not up-and-in.
#[derive(Default)]
pub(super) struct OutTargets {
    pub down: u32,
    pub reintegrating: u32,
    pub ranks: Vec<RankTargetState>,
}

impl OutTargets {
    pub(super) fn of(s: &MsState, p: &PoolRec) -> OutTargets {
        let mut out = OutTargets::default();
        for (&rank, o) in s.pool_out.get(&p.uuid).into_iter().flatten() {
            match o.state {
                OutState::Up => out.reintegrating += rank_targets(p, rank),
                OutState::Down | OutState::DownOut => out.down += rank_targets(p, rank),
            }
            out.ranks.push(RankTargetState {
                rank,
                state: target_state(s, &p.uuid, rank).into(),
            });
        }
        out
    }
}

/// Watch heartbeats and reintegrations for as long as the service runs.
pub fn spawn_pool_watch(ms: Arc<MgmtService>) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(WATCH_EVERY).await;
            ms.watch_pools().await;
        }
    });
}

impl MgmtService {
    /// An epoch below every update `rank` may have missed. From when it was
    /// last heard of: a rank that said it stops has no heartbeat left, and
    /// counting from this service's start instead made the copy cover
    /// everything since then, and a service up for longer than the
    /// reintegration window wiped such a rank whole on its return.
    fn horizon(&self, rank: u32) -> u64 {
        let last = self
            .last_heard
            .lock()
            .get(&rank)
            .copied()
            .unwrap_or(self.started);
        let back = last.elapsed() + REINTEGRATION_MARGIN;
        epoch_now().saturating_sub(back.as_nanos() as u64)
    }

    /// Whether a rank out since `o` has been out longer than the
    /// reintegration window.
    fn window_passed(&self, o: RankOut) -> bool {
        let out_for = epoch_now().saturating_sub(o.since) / 1_000_000_000;
        out_for > REINTEGRATION_MARGIN.as_secs() + self.node.cfg.reintegration_window_s
    }

    /// Empty the pool shards of a rank that returns after the reintegration
    /// window: destroy and create them again (it is DOWN: it serves no I/O).
    async fn wipe_pool_shard(&self, s: &MsState, pool: &Uuid, rank: u32) -> Result<(), String> {
        let p = s.pools.get(pool).ok_or("pool destroyed")?;
        let m = s.members.get(&rank).ok_or("not a member")?;
        let mut c = engine_client(&m.control_addr)
            .await
            .map_err(|e| e.message().to_string())?;
        let id = pool.to_string();
        c.pool_shard_destroy(PoolShardDestroyReq {
            pool_uuid: id.clone(),
        })
        .await
        .map_err(|e| format!("destroy: {}", e.message()))?;
        c.pool_shard_create(PoolShardCreateReq {
            pool_uuid: id,
            scm_per_target: p.scm_per_target,
            nvme_per_target: p.nvme_per_target,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("create: {}", e.message()))?;
        tracing::info!("pool {pool}: rank {rank}'s shards wiped for a whole copy");
        Ok(())
    }

    /// Whether `rank` is alive with its storage open (it can take writes).
    fn ready(&self, s: &MsState, rank: u32) -> bool {
        self.alive(rank)
            && s.members
                .get(&rank)
                .is_some_and(|m| m.state == EngineState::Ready)
    }

    /// One round: exclude ranks that stopped answering, let returned ones
    /// take writes, and start the reintegrations due.
    async fn watch_pools(self: &Arc<Self>) {
        // A service just started has heard from nobody yet.
        let detect = self.started.elapsed() >= HEARTBEAT_TIMEOUT;
        let mut s = self.state.lock().await;
        let mut changed = Vec::new();
        let uuids: Vec<Uuid> = s.pools.keys().copied().collect();
        for uuid in uuids {
            let ranks = s.pools[&uuid].ranks.clone();
            let mut moved = false;
            for rank in ranks {
                let cur = s.pool_out.get(&uuid).and_then(|o| o.get(&rank)).copied();
                let next = match cur {
                    // Alive without its storage (maintenance) serves nothing
                    // either. One that said it stops is out at once.
                    None if (detect || self.stopping.lock().contains(&rank))
                        && !self.ready(&s, rank) =>
                    {
                        Some(RankOut {
                            state: OutState::Down,
                            since: self.horizon(rank),
                            full: false,
                        })
                    }
                    Some(o) if o.state == OutState::Up && !self.alive(rank) => Some(RankOut {
                        state: OutState::Down,
                        ..o
                    }),
                    Some(o) if o.state == OutState::Down && self.ready(&s, rank) && !o.full => {
                        Some(RankOut {
                            state: OutState::Up,
                            ..o
                        })
                    }
                    Some(o) if o.state == OutState::Down && self.ready(&s, rank) => {
                        // Still DOWN (no I/O) while its shards are wiped.
                        match self.wipe_pool_shard(&s, &uuid, rank).await {
                            Ok(()) => Some(RankOut {
                                state: OutState::Up,
                                since: 0,
                                full: false,
                            }),
                            Err(e) => {
                                tracing::warn!(
                                    "pool {uuid}: rank {rank} is back after the reintegration window; wiping its shards: {e}"
                                );
                                None
                            }
                        }
                    }
                    Some(o) if o.state == OutState::Down && !o.full && self.window_passed(o) => {
                        Some(RankOut { full: true, ..o })
                    }
                    _ => None,
                };
                if let Some(n) = next {
                    tracing::warn!(
                        "pool {uuid}: rank {rank} {}",
                        match n.state {
                            OutState::Down if n.full => "has been out longer than the reintegration window: aggregation goes on, it will be copied whole",
                            OutState::Down => "stopped answering: its targets are excluded",
                            OutState::Up => "is back: reintegrating its targets",
                            OutState::DownOut => "is out",
                        }
                    );
                    s.pool_out.entry(uuid).or_default().insert(rank, n);
                    moved = true;
                }
            }
            if moved {
                s.pools.get_mut(&uuid).expect("listed").map_version += 1;
                changed.push(uuid);
            }
        }
        if !changed.is_empty() {
            if let Err(e) = self.persist(&s) {
                tracing::error!("pool maps not persisted: {}", e.message());
                return;
            }
            for uuid in &changed {
                // Best effort here: reintegration pushes again and insists.
                let _ = self.push_pool_map(&s, &s.pools[uuid]).await;
            }
        }
        let due: Vec<Uuid> = s
            .pool_out
            .iter()
            .filter(|(_, o)| o.values().any(|r| r.state == OutState::Up))
            .map(|(u, _)| *u)
            .collect();
        drop(s);
        for uuid in due {
            let mut running = self.reintegrations.lock();
            match running.get(&uuid) {
                Some(Reintegration::Running) => continue,
                Some(Reintegration::Failed(at)) if at.elapsed() < RETRY_AFTER => continue,
                _ => {}
            }
            running.insert(uuid, Reintegration::Running);
            let ms = self.clone();
            tokio::spawn(async move {
                let outcome = match ms.reintegrate(uuid).await {
                    Ok(()) => None,
                    Err(e) => {
                        tracing::warn!("pool {uuid}: reintegration: {e}; will retry");
                        Some(Reintegration::Failed(Instant::now()))
                    }
                };
                let mut running = ms.reintegrations.lock();
                match outcome {
                    None => running.remove(&uuid),
                    Some(f) => running.insert(uuid, f),
                };
            });
        }
    }

    /// Tell every live engine of the pool its map version and state; the
    /// first failure is returned (after trying them all).
    pub(super) async fn push_pool_map(&self, s: &MsState, pool: &PoolRec) -> Result<(), String> {
        let mut first_err = None;
        for &rank in &pool.ranks {
            if !self.alive(rank) {
                continue;
            }
            let Some(m) = s.members.get(&rank) else {
                continue;
            };
            let req = view(s, pool, rank);
            let res = tokio::time::timeout(PUSH_TIMEOUT, async {
                let mut c = engine_client(&m.control_addr).await?;
                c.pool_map_update(req).await
            })
            .await;
            let err = match res {
                Ok(Ok(_)) => continue,
                Ok(Err(e)) => e.message().to_string(),
                Err(_) => format!("no answer within {PUSH_TIMEOUT:?}"),
            };
            tracing::warn!(
                "pool {}: map version {} not taken by rank {rank}: {err}",
                pool.uuid,
                pool.map_version
            );
            first_err.get_or_insert(format!("rank {rank}: {err}"));
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Bring the pool's reintegrating ranks up to date, then put them in.
    async fn reintegrate(self: &Arc<Self>, pool: Uuid) -> Result<(), String> {
        let (version, ranks, since) = {
            let s = self.state.lock().await;
            let p = s.pools.get(&pool).ok_or("pool destroyed")?;
            let up: Vec<(u32, u64)> = s
                .pool_out
                .get(&pool)
                .into_iter()
                .flatten()
                .filter(|(_, o)| o.state == OutState::Up)
                .map(|(&r, o)| (r, o.since))
                .collect();
            if up.is_empty() {
                return Ok(());
            }
            // Every live engine refuses maps without the returning targets
            // in them before anything is copied.
            self.push_pool_map(&s, p).await?;
            let since = up.iter().map(|u| u.1).min().expect("not empty");
            let ranks: Vec<u32> = up.into_iter().map(|u| u.0).collect();
            (p.map_version, ranks, since)
        };
        let started = Instant::now();
        tracing::info!("pool {pool}: reintegrating ranks {ranks:?} from epoch {since}");
        let addr = self.node.cfg.control_addr();
        let security = self.node.cfg.security();
        let copy_ranks = ranks.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        // The client library blocks and runs its own runtime: a plain thread.
        std::thread::Builder::new()
            .name(format!("reint-{pool}"))
            .spawn(move || {
                let r = crate::tls::own_client(&addr, &security).and_then(|c| {
                    peregrine::reintegrate::reintegrate_pool(
                        &c,
                        &pool.to_string(),
                        &copy_ranks,
                        since,
                    )
                });
                let _ = tx.send(r);
            })
            .map_err(|e| format!("cannot start the copy: {e}"))?;
        let stats = rx
            .await
            .map_err(|_| "the copy thread died".to_string())?
            .map_err(|e| e.to_string())?;
        let mut s = self.state.lock().await;
        let Some(p) = s.pools.get(&pool) else {
            return Ok(());
        };
        if p.map_version != version {
            // A target moved meanwhile (maybe one of these, and back): the
            // copy may have missed what it skipped. Copy again.
            return Err(format!(
                "pool map changed during the copy (version {version} -> {})",
                p.map_version
            ));
        }
        let out = s.pool_out.entry(pool).or_default();
        for r in &ranks {
            out.remove(r);
        }
        if out.is_empty() {
            s.pool_out.remove(&pool);
        }
        let p = s.pools.get_mut(&pool).expect("checked");
        p.map_version += 1;
        self.persist(&s).map_err(|e| e.message().to_string())?;
        tracing::info!(
            "pool {pool}: ranks {ranks:?} reintegrated in {:?} ({stats}); map version {}",
            started.elapsed(),
            s.pools[&pool].map_version
        );
        let _ = self.push_pool_map(&s, &s.pools[&pool]).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{MemberRec, PoolRec};
    use super::*;

    fn pool(ranks: &[u32]) -> PoolRec {
        PoolRec {
            uuid: Uuid::new_v4(),
            label: "tank".into(),
            ranks: ranks.to_vec(),
            targets: vec![2; ranks.len()],
            scm_per_target: 1 << 20,
            nvme_per_target: 1 << 20,
            props: Default::default(),
            map_version: 1,
            conts: Default::default(),
            access: crate::ms::access::new_access(),
        }
    }

    fn state() -> (MsState, Uuid) {
        let p = pool(&[0, 1, 2]);
        let uuid = p.uuid;
        let mut s = MsState {
            system: "test".into(),
            ..Default::default()
        };
        s.members.insert(
            1,
            MemberRec {
                rank: 1,
                uuid: "u".into(),
                control_addr: "c".into(),
                data_addr: "d".into(),
                fault_domain: "/h1".into(),
                targets: 2,
                state: EngineState::Ready,
                shm_path: String::new(),
            },
        );
        s.pools.insert(uuid, p);
        (s, uuid)
    }

    #[test]
    fn states_survive_a_restart() {
        let (mut s, uuid) = state();
        s.pool_out.entry(uuid).or_default().insert(
            2,
            RankOut {
                state: OutState::Up,
                since: 42,
                full: false,
            },
        );
        let back = MsState::decode(&s.encode()).unwrap();
        assert_eq!(back.pool_out, s.pool_out);
        assert_eq!(back.pools[&uuid].ranks, vec![0, 1, 2]);
        // Earlier encodings: persist's tests.
    }

    #[test]
    fn views_counts_and_aggregation_cap() {
        let (mut s, uuid) = state();
        assert_eq!(target_state(&s, &uuid, 1), TargetState::TargetUpIn);
        assert_eq!(views_of_rank(&s, 1)[0].aggregation_cap, 0);
        let out = s.pool_out.entry(uuid).or_default();
        out.insert(
            1,
            RankOut {
                state: OutState::Down,
                since: 30,
                full: true,
            },
        );
        out.insert(
            2,
            RankOut {
                state: OutState::Up,
                since: 50,
                full: false,
            },
        );
        let v = views_of_rank(&s, 1);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].state, TargetState::TargetDown as i32);
        assert_eq!(
            v[0].aggregation_cap, 50,
            "the oldest epoch a copy needs, of ranks still within the window"
        );
        assert_eq!(
            views_of_rank(&s, 0)[0].state,
            TargetState::TargetUpIn as i32
        );
        assert!(views_of_rank(&s, 7).is_empty());
        assert_eq!((targets_out(&s, 0), targets_out(&s, 1)), (0, 2));
        let o = OutTargets::of(&s, &s.pools[&uuid]);
        assert_eq!((o.down, o.reintegrating, o.ranks.len()), (2, 2, 2));
        // Back after the window, wiped, copied whole from epoch 0: its copy
        // still holds aggregation back (0 would mean no cap at all).
        s.pool_out.get_mut(&uuid).unwrap().insert(
            2,
            RankOut {
                state: OutState::Up,
                since: 0,
                full: false,
            },
        );
        assert_eq!(views_of_rank(&s, 1)[0].aggregation_cap, 1);
    }
}
