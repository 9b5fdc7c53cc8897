//! Placement: which targets hold which shards of an object, computed from
//! the pool map alone (no lookups, as DAOS).
//!
//! - An object has `groups` redundancy groups of `group_size` shards each;
//!   classes with [`GROUPS_MAX`] groups get `max(1, targets / group_size)`.
//! - A dkey selects its group: `hash(oid, dkey) % groups`.
//! - Shard `i` of group `g` (shard number `g * group_size + i`) is placed by
//!   jump consistent hash (Lamping & Veach) of `hash(oid, g, i, attempt)`
//!   over the map's targets, retrying with the next `attempt` while the
//!   target's engine (rank) already holds a shard of the group, or while an
//!   earlier shard of the object holds the target (until every target holds
//!   one); after [`MAX_ATTEMPTS`] it walks the targets in map order from the
//!   last candidate. Shard 0 of group 0 is thus exactly "jump hash of
//!   hash(oid, 0)", and one-group objects keep jump hash's minimal movement
//!   when targets are added. Distinct ranks per group is what makes replicas
//!   and EC cells survive an engine loss; distinct targets per object is
//!   what makes a striped object (S2, SX, ...) use every target: without it,
//!   two groups on two targets share one half of the time.
//!
//! The hashes are defined here (splitmix64 / FNV-1a), not taken from std,
//! because every client of every version must compute the same layout.

use crate::error::{Error, Result};
use peregrine_proto::mgmt;
use peregrine_proto::oclass::GROUPS_MAX;
use peregrine_proto::{ObjectClass, ObjectId};
use uuid::Uuid;

/// Jump-hash attempts before falling back to a linear walk.
pub const MAX_ATTEMPTS: u32 = 64;

/// One target of the pool map, in placement order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub rank: u32,
    /// Target index inside its engine.
    pub index: u32,
    /// Data-plane address of the engine, "host:port".
    pub addr: String,
    pub fault_domain: String,
    /// Takes writes: up-and-in, or back and being reintegrated. A write
    /// skips a target only when the pool map says it is down.
    pub up: bool,
    /// Serves reads: up-and-in only (a reintegrating target may be stale).
    pub readable: bool,
    /// The engine's shared-memory socket ("" when it has none); usable only
    /// on the engine's node.
    pub shm_path: String,
}

/// The client's view of a pool map.
#[derive(Clone, Debug)]
pub struct PoolMap {
    pub uuid: Uuid,
    pub label: String,
    pub version: u64,
    pub targets: Vec<Target>,
    /// The pool handle this client connected with (see
    /// `peregrine_proto::handle`): requests that name no container carry it.
    pub handle: Vec<u8>,
}

impl PoolMap {
    pub fn from_proto(m: mgmt::PoolMap) -> Result<PoolMap> {
        let uuid = Uuid::parse_str(&m.uuid).map_err(|e| {
            Error::new(
                -libc::EPROTO,
                format!("pool map of {:?}: bad uuid {:?}: {e}", m.label, m.uuid),
            )
        })?;
        if m.targets.is_empty() {
            return Err(Error::new(
                -libc::EPROTO,
                format!("pool map of {:?} has no targets", m.label),
            ));
        }
        let targets = m
            .targets
            .into_iter()
            .map(|t| Target {
                rank: t.rank,
                index: t.index,
                addr: t.data_addr,
                fault_domain: t.fault_domain,
                up: t.up,
                readable: t.up && t.state == mgmt::TargetState::TargetUpIn as i32,
                shm_path: t.shm_path,
            })
            .collect();
        Ok(PoolMap {
            uuid,
            label: m.label,
            version: m.version,
            targets,
            handle: m.handle,
        })
    }

    /// How the pool is named in messages: its label, else its UUID.
    pub fn name(&self) -> String {
        if self.label.is_empty() {
            self.uuid.to_string()
        } else {
            self.label.clone()
        }
    }

    /// Number of distinct engines (ranks) in the map.
    pub fn engines(&self) -> usize {
        let mut r: Vec<u32> = self.targets.iter().map(|t| t.rank).collect();
        r.sort_unstable();
        r.dedup();
        r.len()
    }
}

/// Where one shard lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardLoc {
    /// Shard number: `group * group_size + index in group`.
    pub shard: u32,
    /// Index into [`PoolMap::targets`].
    pub target: usize,
}

/// The shards of one redundancy group, index order (data cells first for EC).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub group: u32,
    pub shards: Vec<ShardLoc>,
}

/// Jump consistent hash (Lamping & Veach 2014): a bucket in `0..buckets`;
/// growing `buckets` by one moves only ~1/(buckets+1) of the keys.
pub fn jump_hash(mut key: u64, buckets: u32) -> u32 {
    assert!(buckets > 0, "jump_hash over zero buckets");
    let mut b: i64 = -1;
    let mut j: i64 = 0;
    while j < buckets as i64 {
        b = j;
        key = key.wrapping_mul(2862933555777941757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as u32
}

/// splitmix64 finalizer: a cheap, well-mixing 64-bit permutation.
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn hash_oid(oid: ObjectId) -> u64 {
    mix64(oid.hi ^ mix64(oid.lo))
}

/// Hash of (oid, dkey), which picks the dkey's group and read replica.
pub fn hash_dkey(oid: ObjectId, dkey: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ hash_oid(oid);
    for &b in dkey {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix64(h ^ dkey.len() as u64)
}

/// Number of groups of `class` over `map`.
pub fn num_groups(class: ObjectClass, map: &PoolMap) -> u32 {
    if class.groups() == GROUPS_MAX {
        (map.targets.len() as u32 / class.group_size()).max(1)
    } else {
        class.groups()
    }
}

/// Fails when the pool cannot hold a group of `class` on distinct engines.
pub fn check_class(class: ObjectClass, map: &PoolMap) -> Result<()> {
    let need = class.group_size() as usize;
    let have = map.engines();
    if have < need {
        return Err(Error::new(
            -libc::EINVAL,
            format!(
                "object class {class} needs {need} engines, pool {:?} has {have}",
                map.name()
            ),
        ));
    }
    Ok(())
}

/// The group of `dkey`.
pub fn dkey_group(oid: ObjectId, dkey: &[u8], groups: u32) -> u32 {
    (hash_dkey(oid, dkey) % groups as u64) as u32
}

/// Every group of object `oid`, in group order.
pub fn layout(map: &PoolMap, oid: ObjectId, class: ObjectClass) -> Result<Vec<Group>> {
    layout_upto(map, oid, class, num_groups(class, map) - 1)
}

/// The shards of group `group` of object `oid` (see [`layout`]).
pub fn group_layout(map: &PoolMap, oid: ObjectId, class: ObjectClass, group: u32) -> Result<Group> {
    Ok(layout_upto(map, oid, class, group)?.pop().expect("a group"))
}

/// Groups `0..=last` of `oid`. Each shard, in shard order, takes the first
/// jump-hash candidate whose engine holds no other shard of its group
/// (required) and that no earlier shard of the object took (wanted: the
/// object's groups spread over distinct targets, so that a striped object
/// keeps every target busy; once every target holds one of its shards, the
/// targets are free to take again). Group 0's layout is therefore that of
/// a one-group object.
fn layout_upto(map: &PoolMap, oid: ObjectId, class: ObjectClass, last: u32) -> Result<Vec<Group>> {
    check_class(class, map)?;
    let n = map.targets.len();
    let gs = class.group_size();
    let mut taken = vec![false; n];
    let mut free = n;
    let mut groups = Vec::with_capacity(last as usize + 1);
    for group in 0..=last {
        let seed = mix64(hash_oid(oid) ^ mix64(group as u64 ^ 0x5eed_0000_0000_0000));
        let mut ranks: Vec<u32> = Vec::with_capacity(gs as usize);
        let mut shards = Vec::with_capacity(gs as usize);
        for i in 0..gs {
            let rank_ok = |c: usize| !ranks.contains(&map.targets[c].rank);
            let mut fallback = None;
            let mut chosen = None;
            let mut last_c = 0usize;
            for attempt in 0..MAX_ATTEMPTS {
                let key = mix64(seed ^ mix64(((i as u64) << 32) | attempt as u64));
                let c = jump_hash(key, n as u32) as usize;
                last_c = c;
                if rank_ok(c) {
                    if !taken[c] {
                        chosen = Some(c);
                        break;
                    }
                    fallback.get_or_insert(c);
                }
            }
            // A linear walk from the last candidate finds a free target
            // (when one suits the group), else the first suitable candidate.
            let walk = |want_free: bool| {
                (1..=n)
                    .map(|d| (last_c + d) % n)
                    .find(|&c| rank_ok(c) && (!want_free || !taken[c]))
            };
            let c = chosen
                .or_else(|| walk(true))
                .or(fallback)
                .or_else(|| walk(false))
                // check_class guarantees an unused rank exists.
                .expect("enough engines");
            ranks.push(map.targets[c].rank);
            if !taken[c] {
                taken[c] = true;
                free -= 1;
                if free == 0 {
                    taken.iter_mut().for_each(|t| *t = false);
                    free = n;
                }
            }
            shards.push(ShardLoc {
                shard: group * gs + i,
                target: c,
            });
        }
        groups.push(Group { group, shards });
    }
    Ok(groups)
}

/// The group holding `dkey` of `oid`.
pub fn place(map: &PoolMap, oid: ObjectId, class: ObjectClass, dkey: &[u8]) -> Result<Group> {
    let g = dkey_group(oid, dkey, num_groups(class, map));
    group_layout(map, oid, class, g)
}

#[cfg(test)]
pub(crate) fn test_map(engines: u32, targets: u32) -> PoolMap {
    let mut t = Vec::new();
    for r in 0..engines {
        for i in 0..targets {
            t.push(Target {
                rank: r,
                index: i,
                addr: format!("127.0.0.1:{}", 20000 + r),
                fault_domain: format!("/node{r}"),
                up: true,
                readable: true,
                shm_path: String::new(),
            });
        }
    }
    PoolMap {
        uuid: Uuid::nil(),
        label: "tank".into(),
        version: 1,
        targets: t,
        handle: vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use peregrine_proto::oclass::ALL_CLASSES;

    fn oid(class: ObjectClass, i: u64) -> ObjectId {
        ObjectId::new(class, i.wrapping_mul(0x9e37_79b9), i)
    }

    #[test]
    fn jump_hash_reference_values() {
        assert_eq!(jump_hash(0, 1), 0);
        assert_eq!(jump_hash(u64::MAX, 1), 0);
        // A key either stays or moves to the new bucket as buckets grow.
        for k in 0..5000u64 {
            let key = mix64(k);
            let mut prev = jump_hash(key, 1);
            for b in 2..64 {
                let now = jump_hash(key, b);
                assert!(now < b);
                assert!(
                    now == prev || now == b - 1,
                    "key {k}: {prev} -> {now} at {b}"
                );
                prev = now;
            }
        }
    }

    #[test]
    fn deterministic_and_on_distinct_ranks() {
        let map = test_map(7, 3);
        for class in ALL_CLASSES {
            for i in 0..300 {
                let o = oid(class, i);
                let dkey = format!("dkey{i}");
                let a = place(&map, o, class, dkey.as_bytes()).unwrap();
                let b = place(&map, o, class, dkey.as_bytes()).unwrap();
                assert_eq!(a, b);
                assert_eq!(a.shards.len() as u32, class.group_size());
                let mut ranks: Vec<u32> = a
                    .shards
                    .iter()
                    .map(|s| map.targets[s.target].rank)
                    .collect();
                ranks.sort_unstable();
                ranks.dedup();
                assert_eq!(
                    ranks.len() as u32,
                    class.group_size(),
                    "{class}: shards share an engine"
                );
                for (j, s) in a.shards.iter().enumerate() {
                    assert_eq!(s.shard, a.group * class.group_size() + j as u32);
                }
                assert!(a.group < num_groups(class, &map));
            }
        }
    }

    #[test]
    fn too_few_engines_is_a_clear_error() {
        let map = test_map(2, 8);
        let e = place(&map, oid(ObjectClass::Rp3G1, 1), ObjectClass::Rp3G1, b"d").unwrap_err();
        assert_eq!(e.code, -libc::EINVAL);
        assert_eq!(
            e.msg,
            "object class RP_3G1 needs 3 engines, pool \"tank\" has 2"
        );
        // Exactly enough engines works, through the fallback walk if needed.
        let map = test_map(3, 1);
        for i in 0..500 {
            let g = place(&map, oid(ObjectClass::Rp3G1, i), ObjectClass::Rp3G1, b"d").unwrap();
            let mut t: Vec<usize> = g.shards.iter().map(|s| s.target).collect();
            t.sort_unstable();
            assert_eq!(t, vec![0, 1, 2]);
        }
    }

    #[test]
    fn groups_count() {
        let map = test_map(4, 4);
        assert_eq!(num_groups(ObjectClass::SX, &map), 16);
        assert_eq!(num_groups(ObjectClass::Rp2GX, &map), 8);
        assert_eq!(num_groups(ObjectClass::Ec2P1GX, &map), 5);
        assert_eq!(num_groups(ObjectClass::S4, &map), 4);
        assert_eq!(num_groups(ObjectClass::Rp3G1, &map), 1);
        assert_eq!(num_groups(ObjectClass::Ec2P1GX, &test_map(2, 1)), 1);
    }

    /// Chi-square of target loads over many objects stays near its
    /// expectation (degrees of freedom = targets - 1).
    #[test]
    fn balanced_over_targets() {
        for (class, engines, tgts) in [
            (ObjectClass::S1, 4, 8),
            (ObjectClass::Rp3G1, 6, 4),
            (ObjectClass::Ec4P2G1, 8, 2),
        ] {
            let map = test_map(engines, tgts);
            let n = map.targets.len();
            let mut load = vec![0f64; n];
            let objs = 20_000u64;
            for i in 0..objs {
                for s in place(&map, oid(class, i), class, b"0").unwrap().shards {
                    load[s.target] += 1.0;
                }
            }
            let expected = objs as f64 * class.group_size() as f64 / n as f64;
            let chi2: f64 = load.iter().map(|l| (l - expected).powi(2) / expected).sum();
            let df = (n - 1) as f64;
            // mean df, sd sqrt(2 df): allow a generous 6 sd.
            assert!(
                chi2 < df + 6.0 * (2.0 * df).sqrt(),
                "{class}: chi2 {chi2:.1} over {n} targets, loads {load:?}"
            );
        }
    }

    #[test]
    fn minimal_movement_when_a_target_is_added() {
        let mut map = test_map(8, 4);
        let n = map.targets.len();
        let objs = 20_000u64;
        let before: Vec<usize> = (0..objs)
            .map(|i| {
                place(&map, oid(ObjectClass::S1, i), ObjectClass::S1, b"k")
                    .unwrap()
                    .shards[0]
                    .target
            })
            .collect();
        map.targets.push(Target {
            rank: 8,
            index: 0,
            addr: "x:1".into(),
            fault_domain: String::new(),
            up: true,
            readable: true,
            shm_path: String::new(),
        });
        let mut moved = 0;
        for (i, b) in before.iter().enumerate() {
            let a = place(&map, oid(ObjectClass::S1, i as u64), ObjectClass::S1, b"k")
                .unwrap()
                .shards[0]
                .target;
            if a != *b {
                assert_eq!(a, n, "a key moved between old targets");
                moved += 1;
            }
        }
        let ideal = objs as f64 / (n + 1) as f64;
        assert!(
            (moved as f64) < ideal * 1.3 && (moved as f64) > ideal * 0.7,
            "moved {moved}, ideal {ideal}"
        );

        // Replicated groups: most shards stay, too.
        let mut map = test_map(8, 4);
        let before: Vec<Group> = (0..2000)
            .map(|i| place(&map, oid(ObjectClass::Rp2G1, i), ObjectClass::Rp2G1, b"k").unwrap())
            .collect();
        map.targets.push(Target {
            rank: 8,
            index: 0,
            addr: "x:1".into(),
            fault_domain: String::new(),
            up: true,
            readable: true,
            shm_path: String::new(),
        });
        let mut kept = 0;
        for (i, b) in before.iter().enumerate() {
            let a = place(
                &map,
                oid(ObjectClass::Rp2G1, i as u64),
                ObjectClass::Rp2G1,
                b"k",
            )
            .unwrap();
            kept += a
                .shards
                .iter()
                .zip(&b.shards)
                .filter(|(x, y)| x == y)
                .count();
        }
        assert!(kept as f64 > 0.9 * 4000.0, "kept {kept} of 4000 shards");
    }

    #[test]
    fn striped_objects_spread_over_distinct_targets() {
        for (engines, tgts) in [(1, 2), (1, 8), (3, 2), (4, 4)] {
            let map = test_map(engines, tgts);
            let n = map.targets.len();
            for i in 0..500 {
                let o = oid(ObjectClass::SX, i);
                let l = layout(&map, o, ObjectClass::SX).unwrap();
                let mut t: Vec<usize> = l.iter().map(|g| g.shards[0].target).collect();
                t.sort();
                t.dedup();
                assert_eq!(t.len(), n, "SX object {i} over {engines}x{tgts}: {l:?}");
                for (g, grp) in l.iter().enumerate() {
                    assert_eq!(
                        group_layout(&map, o, ObjectClass::SX, g as u32).unwrap(),
                        *grp
                    );
                }
            }
            // Replicated groups over every target: distinct ranks in a group, all targets used.
            if engines >= 3 {
                let l = layout(&map, oid(ObjectClass::Rp2GX, 7), ObjectClass::Rp2GX).unwrap();
                let mut all = Vec::new();
                for g in &l {
                    let r: Vec<u32> = g
                        .shards
                        .iter()
                        .map(|s| map.targets[s.target].rank)
                        .collect();
                    assert_ne!(r[0], r[1], "{l:?}");
                    all.extend(g.shards.iter().map(|s| s.target));
                }
                all.sort();
                all.dedup();
                assert_eq!(all.len(), l.len() * 2, "{l:?}");
            }
        }
    }

    #[test]
    fn dkeys_spread_over_groups() {
        let map = test_map(4, 4);
        let o = oid(ObjectClass::SX, 42);
        let mut seen = vec![0; 16];
        for d in 0..1600 {
            seen[place(&map, o, ObjectClass::SX, format!("{d}").as_bytes())
                .unwrap()
                .group as usize] += 1;
        }
        assert!(seen.iter().all(|&c| c > 50), "{seen:?}");
    }
}
