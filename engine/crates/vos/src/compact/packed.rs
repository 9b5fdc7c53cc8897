//! [`Packed`]: the large maps of the index (a container's objects, a
//! directory's names) kept with full nodes.
//!
//! Keys inserted in ascending order (new objects, the file names of a run)
//! leave each `BTreeMap` node split at insertion a little over half full
//! for good, so a map grown that way takes about twice the node memory of
//! one built at once from its sorted entries. A [`Packed`] map builds
//! itself again from its entries each time it has grown by a quarter since
//! it was last built, a checkpoint rebuilds it too (it walks the whole
//! index anyway), and decoding one builds it at once.

use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

/// A map is rebuilt once it holds this many entries, then at each growth
/// by [`GROWTH`] of it: O(1) moves per insert amortized (five), and at
/// most a fifth of the entries in nodes left half full. Small, so that
/// directories of a few hundred names are kept full too: checkpoints,
/// which rebuild every map, come only as the WAL grows with the index.
const REPACK_FROM: usize = 32;
/// The fraction (1 / this) a map grows by between rebuilds.
const GROWTH: usize = 4;

/// A `BTreeMap` (which it derefs to) that keeps its nodes nearly full:
/// insert new keys through [`Packed::get_or_insert_with`].
/// Serialized as the `BTreeMap`.
#[derive(Clone)]
pub(crate) struct Packed<K, V> {
    map: BTreeMap<K, V>,
    /// Entries when last built.
    built: usize,
}

impl<K, V> Default for Packed<K, V> {
    fn default() -> Self {
        Packed {
            map: BTreeMap::new(),
            built: 0,
        }
    }
}

impl<K: Ord, V> Packed<K, V> {
    /// The value of `k`, inserted from `new` when absent; a new key that
    /// finds the map grown by a quarter since its last build rebuilds it.
    pub(crate) fn get_or_insert_with(&mut self, k: K, new: impl FnOnce() -> V) -> &mut V {
        let due = self.map.len() >= REPACK_FROM.max(self.built + self.built / GROWTH);
        if due && !self.map.contains_key(&k) {
            self.repack();
        }
        self.map.entry(k).or_insert_with(new)
    }
    pub(crate) fn entry_or_default(&mut self, k: K) -> &mut V
    where
        V: Default,
    {
        self.get_or_insert_with(k, V::default)
    }
    /// Build the map again from its entries, with full nodes. O(n).
    pub(crate) fn repack(&mut self) {
        self.map = std::mem::take(&mut self.map).into_iter().collect();
        self.built = self.map.len();
    }
}

impl<K, V> Deref for Packed<K, V> {
    type Target = BTreeMap<K, V>;
    fn deref(&self) -> &BTreeMap<K, V> {
        &self.map
    }
}

/// Changes in place; new keys belong to [`Packed::get_or_insert_with`]
/// (an insert through here only misses a rebuild).
impl<K, V> DerefMut for Packed<K, V> {
    fn deref_mut(&mut self) -> &mut BTreeMap<K, V> {
        &mut self.map
    }
}

impl<K: Ord, V> From<BTreeMap<K, V>> for Packed<K, V> {
    fn from(map: BTreeMap<K, V>) -> Self {
        let built = map.len();
        Packed { map, built }
    }
}

impl<K: Ord, V> FromIterator<(K, V)> for Packed<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(i: I) -> Self {
        Packed::from(i.into_iter().collect::<BTreeMap<K, V>>())
    }
}

/// By content (when it was last built is no part of it).
impl<K: PartialEq, V: PartialEq> PartialEq for Packed<K, V> {
    fn eq(&self, o: &Self) -> bool {
        self.map == o.map
    }
}
impl<K: Eq, V: Eq> Eq for Packed<K, V> {}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for Packed<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.map.fmt(f)
    }
}

impl<K: Serialize, V: Serialize> Serialize for Packed<K, V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.map.serialize(s)
    }
}

impl<'de, K: Ord + Deserialize<'de>, V: Deserialize<'de>> Deserialize<'de> for Packed<K, V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V_<K, V>(PhantomData<(K, V)>);
        impl<'de, K: Ord + Deserialize<'de>, V: Deserialize<'de>> Visitor<'de> for V_<K, V> {
            type Value = Packed<K, V>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: MapAccess<'de>>(self, a: A) -> Result<Self::Value, A::Error> {
                packed_entries(a)
            }
        }
        d.deserialize_map(V_(PhantomData))
    }
}

/// The entries of a serialized map, built at once (full nodes) rather than
/// inserted one by one.
pub(super) fn packed_entries<'de, K, V, A>(mut a: A) -> Result<Packed<K, V>, A::Error>
where
    K: Ord + Deserialize<'de>,
    V: Deserialize<'de>,
    A: MapAccess<'de>,
{
    // The hint comes from the data: reserve no more than a bounded start.
    let mut v: Vec<(K, V)> = Vec::with_capacity(a.size_hint().unwrap_or(0).min(1 << 16));
    while let Some(e) = a.next_entry()? {
        v.push(e);
    }
    Ok(v.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_maps_rebuild_as_they_grow_and_keep_their_entries() {
        let mut m: Packed<u64, u64> = Packed::default();
        let mut want = BTreeMap::new();
        let mut builds = vec![];
        for i in 0..10_000u64 {
            *m.entry_or_default(i) += i * 3;
            want.insert(i, i * 3);
            if builds.last() != Some(&m.built) {
                builds.push(m.built);
            }
        }
        assert_eq!(*m, want);
        // Rebuilt at 32 entries, then at each growth by a quarter.
        assert_eq!(
            builds,
            [
                0, 32, 40, 50, 62, 77, 96, 120, 150, 187, 233, 291, 363, 453, 566, 707, 883, 1103,
                1378, 1722, 2152, 2690, 3362, 4202, 5252, 6565, 8206
            ]
        );
        // An existing key rebuilds nothing.
        let built = m.built;
        *m.entry_or_default(5) += 1;
        assert_eq!(m.built, built);
        // Decoded from the bytes of a plain map, as a checkpoint holds them.
        let d: Packed<u64, u64> =
            bincode::deserialize(&bincode::serialize(&want).unwrap()).unwrap();
        assert_eq!(*d, want);
        assert_eq!(d.built, want.len());
        assert_eq!(
            bincode::serialize(&d).unwrap(),
            bincode::serialize(&want).unwrap()
        );
    }
}
