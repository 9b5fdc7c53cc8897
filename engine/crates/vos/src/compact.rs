//! Compact containers for the index trees (issue 19, point 7).
//!
//! Most levels of the index hold one entry (one akey per dkey, one version
//! per akey), and a `BTreeMap` allocates a whole node (room for 11 keys and
//! values, about 1 KiB here) even for one; a `Vec` grows to 4 elements on
//! its first push. [`SmallMap`] holds one entry in place (no allocation),
//! up to [`SMALL`] entries in a sorted vector of exactly their size, and
//! turns into a `BTreeMap` past that (a directory's names); [`Key`] holds
//! keys of up to 22 bytes inline (no allocation: akeys, chunk indexes, most
//! file names).
//!
//! Both serialize exactly as the types they replace (`BTreeMap<K, V>` and
//! `Vec<u8>`), so checkpoints written before them load, and theirs load in
//! an engine of before them.

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::btree_map;
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Bound, Deref, DerefMut, RangeBounds};

mod packed;
use packed::packed_entries;
pub(crate) use packed::Packed;

/// Keys up to this many bytes are held inline.
const INLINE: usize = 22;

/// Bytes of a dkey or akey: inline up to 22 bytes, boxed beyond (24 bytes
/// either way, against 24 for a `Vec<u8>` plus its allocation).
#[derive(Clone)]
pub(crate) enum Key {
    Inline { len: u8, buf: [u8; INLINE] },
    Heap(Box<[u8]>),
}

impl Key {
    pub(crate) fn new(b: &[u8]) -> Key {
        if b.len() <= INLINE {
            let mut buf = [0u8; INLINE];
            buf[..b.len()].copy_from_slice(b);
            Key::Inline {
                len: b.len() as u8,
                buf,
            }
        } else {
            Key::Heap(b.into())
        }
    }
    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            Key::Inline { len, buf } => &buf[..*len as usize],
            Key::Heap(b) => b,
        }
    }
}

impl From<Vec<u8>> for Key {
    fn from(v: Vec<u8>) -> Key {
        if v.len() <= INLINE {
            Key::new(&v)
        } else {
            Key::Heap(v.into_boxed_slice())
        }
    }
}

impl From<&[u8]> for Key {
    fn from(b: &[u8]) -> Key {
        Key::new(b)
    }
}

impl Deref for Key {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl Borrow<[u8]> for Key {
    fn borrow(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl PartialEq for Key {
    fn eq(&self, o: &Key) -> bool {
        self.as_bytes() == o.as_bytes()
    }
}
impl Eq for Key {}
impl PartialOrd for Key {
    fn partial_cmp(&self, o: &Key) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Key {
    fn cmp(&self, o: &Key) -> Ordering {
        self.as_bytes().cmp(o.as_bytes())
    }
}
impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.as_bytes().hash(h)
    }
}
impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(self.as_bytes()))
    }
}

/// As a `Vec<u8>` serializes in bincode (see [`bytes`]).
impl Serialize for Key {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.as_bytes())
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
        d.deserialize_bytes(BytesVisitor).map(Key::from)
    }
}

/// Keys up to this many bytes are held inline in a [`ShortKey`].
const SHORT_INLINE: usize = 15;

/// The length of a [`ShortKey`] held inline, 0 to 15: an enum, so that
/// the other values of its byte tell the key's two forms apart at no cost.
#[derive(Clone, Copy, PartialEq, Eq)]
#[rustfmt::skip]
#[repr(u8)]
pub(crate) enum ShortLen { L0, L1, L2, L3, L4, L5, L6, L7, L8, L9, L10, L11, L12, L13, L14, L15 }

impl ShortLen {
    #[rustfmt::skip]
    const ALL: [ShortLen; SHORT_INLINE + 1] = {
        use ShortLen::*;
        [L0, L1, L2, L3, L4, L5, L6, L7, L8, L9, L10, L11, L12, L13, L14, L15]
    };
}

/// An akey: inline up to 15 bytes, boxed beyond (16 bytes, where a [`Key`]
/// takes 24). Akeys are short names ("inode", "d", xattr names): with it
/// an akey and its tree fill a 64-byte malloc chunk instead of an 80-byte
/// one, twice per file. A longer akey pays a second allocation (the boxed
/// slice behind a thin box).
#[derive(Clone)]
pub(crate) enum ShortKey {
    Inline {
        len: ShortLen,
        buf: [u8; SHORT_INLINE],
    },
    #[allow(clippy::redundant_allocation)]
    Heap(Box<Box<[u8]>>),
}

impl ShortKey {
    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            ShortKey::Inline { len, buf } => &buf[..*len as usize],
            ShortKey::Heap(b) => b,
        }
    }
}

impl From<Vec<u8>> for ShortKey {
    fn from(v: Vec<u8>) -> ShortKey {
        if v.len() <= SHORT_INLINE {
            let mut buf = [0u8; SHORT_INLINE];
            buf[..v.len()].copy_from_slice(&v);
            ShortKey::Inline {
                len: ShortLen::ALL[v.len()],
                buf,
            }
        } else {
            ShortKey::Heap(Box::new(v.into_boxed_slice()))
        }
    }
}

impl Deref for ShortKey {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl Borrow<[u8]> for ShortKey {
    fn borrow(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl PartialEq for ShortKey {
    fn eq(&self, o: &ShortKey) -> bool {
        self.as_bytes() == o.as_bytes()
    }
}
impl Eq for ShortKey {}
impl PartialOrd for ShortKey {
    fn partial_cmp(&self, o: &ShortKey) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for ShortKey {
    fn cmp(&self, o: &ShortKey) -> Ordering {
        self.as_bytes().cmp(o.as_bytes())
    }
}
impl std::hash::Hash for ShortKey {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.as_bytes().hash(h)
    }
}
impl fmt::Debug for ShortKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(self.as_bytes()))
    }
}

/// As a `Vec<u8>` serializes in bincode (see [`bytes`]).
impl Serialize for ShortKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.as_bytes())
    }
}

impl<'de> Deserialize<'de> for ShortKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ShortKey, D::Error> {
        d.deserialize_bytes(BytesVisitor).map(ShortKey::from)
    }
}

/// Byte strings read whole: bincode writes a `Vec<u8>` (a sequence of
/// bytes) and a byte string the same way, a length then the bytes, but
/// reads a sequence one byte per call. For `#[serde(with = "bytes")]` on
/// `Vec<u8>` fields of checkpoints and WAL records: same bytes, loaded at
/// the speed of a copy.
pub(crate) mod bytes {
    use super::BytesVisitor;
    use serde::{Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(b)
    }
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        d.deserialize_byte_buf(BytesVisitor)
    }
}

/// Bytes however the format hands them over (whole, or as a sequence).
struct BytesVisitor;

impl<'de> Visitor<'de> for BytesVisitor {
    type Value = Vec<u8>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("bytes")
    }
    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
        Ok(v.to_vec())
    }
    fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
        Ok(v)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Vec<u8>, A::Error> {
        let mut v = Vec::with_capacity(a.size_hint().unwrap_or(0).min(1 << 16));
        while let Some(b) = a.next_element()? {
            v.push(b);
        }
        Ok(v)
    }
}

/// Entries a [`SmallMap`] keeps in its sorted vector; one more makes it a tree.
pub(crate) const SMALL: usize = 8;

/// A sorted map: its one entry in place, a boxed slice of exactly its
/// entries up to [`SMALL`] of them, a boxed `BTreeMap` beyond. Equality is
/// by content, whatever the form. Most maps of the index hold one entry (a
/// file's one chunk, a chunk's one akey, a name's one akey), and that one
/// takes no block of its own: a block would cost its pointer, and in an
/// allocator its rounding, on top of the entry (a block per level per file).
#[derive(Clone)]
pub(crate) enum SmallMap<K, V> {
    One((K, V)),
    /// None, or 2 to [`SMALL`] entries.
    Vec(Box<[(K, V)]>),
    // Boxed for a thin pointer: the tree form is the rare one (past SMALL
    // entries).
    Tree(Box<Packed<K, V>>),
}

impl<K, V> Default for SmallMap<K, V> {
    fn default() -> Self {
        SmallMap::Vec(Box::default())
    }
}

/// Change a boxed slice through a `Vec` of its elements (no copy: a boxed
/// slice is a vector whose capacity is its length), leaving it boxed again
/// at exactly its new length.
fn edit<T, R>(b: &mut Box<[T]>, f: impl FnOnce(&mut Vec<T>) -> R) -> R {
    let mut v = std::mem::take(b).into_vec();
    let r = f(&mut v);
    *b = v.into_boxed_slice();
    r
}

/// Ascending entries of a [`SmallMap`] (either end).
pub(crate) enum Iter<'a, K, V> {
    Vec(std::slice::Iter<'a, (K, V)>),
    Tree(btree_map::Range<'a, K, V>),
}

impl<'a, K, V> Iterator for Iter<'a, K, V> {
    type Item = (&'a K, &'a V);
    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Iter::Vec(i) => i.next().map(|(k, v)| (k, v)),
            Iter::Tree(i) => i.next(),
        }
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        match self {
            Iter::Vec(i) => i.size_hint(),
            Iter::Tree(i) => i.size_hint(),
        }
    }
}

impl<K, V> DoubleEndedIterator for Iter<'_, K, V> {
    fn next_back(&mut self) -> Option<Self::Item> {
        match self {
            Iter::Vec(i) => i.next_back().map(|(k, v)| (k, v)),
            Iter::Tree(i) => i.next_back(),
        }
    }
}

impl<K: Ord, V> SmallMap<K, V> {
    pub(crate) fn len(&self) -> usize {
        match self {
            SmallMap::One(_) => 1,
            SmallMap::Vec(v) => v.len(),
            SmallMap::Tree(t) => t.len(),
        }
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Position of `k` in the vector form (Ok: found).
    fn find<Q>(v: &[(K, V)], k: &Q) -> Result<usize, usize>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        v.binary_search_by(|(x, _)| x.borrow().cmp(k))
    }
    pub(crate) fn get<Q>(&self, k: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        match self {
            SmallMap::One((x, v)) => (x.borrow() == k).then_some(v),
            SmallMap::Vec(v) => Self::find(v, k).ok().map(|i| &v[i].1),
            SmallMap::Tree(t) => t.get(k),
        }
    }
    /// The value of `k`, inserted from `new` when absent.
    pub(crate) fn get_or_insert_with(&mut self, k: K, new: impl FnOnce() -> V) -> &mut V {
        // First the form that has room for `k`.
        match self {
            SmallMap::Vec(v) if v.is_empty() => {
                *self = SmallMap::One((k, new()));
                let SmallMap::One((_, v)) = self else {
                    unreachable!("just set")
                };
                return v;
            }
            SmallMap::One((x, _)) if *x != k => {
                let SmallMap::One(e) = std::mem::take(self) else {
                    unreachable!("matched")
                };
                *self = SmallMap::Vec(Box::new([e]));
            }
            SmallMap::Vec(v) if v.len() >= SMALL && Self::find(v, &k).is_err() => {
                let t: Packed<K, V> = std::mem::take(v).into_vec().into_iter().collect();
                *self = SmallMap::Tree(Box::new(t));
            }
            _ => {}
        }
        match self {
            SmallMap::One((_, v)) => v,
            SmallMap::Vec(v) => {
                let i = match Self::find(v, &k) {
                    Ok(i) => i,
                    Err(i) => {
                        // Exactly one more: a first push would make room for 4.
                        edit(v, |v| {
                            v.reserve_exact(1);
                            v.insert(i, (k, new()))
                        });
                        i
                    }
                };
                &mut v[i].1
            }
            SmallMap::Tree(t) => t.get_or_insert_with(k, new),
        }
    }
    /// A vector left with one entry keeps it in place.
    fn settle(&mut self) {
        if let SmallMap::Vec(v) = self {
            if v.len() == 1 {
                let e = std::mem::take(v).into_vec().pop().expect("one entry");
                *self = SmallMap::One(e);
            }
        }
    }
    /// Rebuild the tree form with full nodes ([`Packed::repack`]).
    pub(crate) fn repack(&mut self) {
        if let SmallMap::Tree(t) = self {
            t.repack();
        }
    }
    pub(crate) fn entry_or_default(&mut self, k: K) -> &mut V
    where
        V: Default,
    {
        self.get_or_insert_with(k, V::default)
    }
    /// Insert or replace; the value replaced.
    pub(crate) fn insert(&mut self, k: K, val: V) -> Option<V> {
        match self {
            SmallMap::One((x, v)) if *x == k => return Some(std::mem::replace(v, val)),
            SmallMap::Vec(v) => {
                if let Ok(i) = Self::find(v, &k) {
                    return Some(std::mem::replace(&mut v[i].1, val));
                }
            }
            _ => {}
        }
        let mut val = Some(val);
        let slot = self.get_or_insert_with(k, || val.take().unwrap());
        val.map(|v| std::mem::replace(slot, v))
    }
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn remove<Q>(&mut self, k: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let out = match self {
            SmallMap::One((x, _)) if (*x).borrow() == k => {
                let SmallMap::One((_, v)) = std::mem::take(self) else {
                    unreachable!("matched")
                };
                Some(v)
            }
            SmallMap::One(_) => None,
            SmallMap::Vec(v) => {
                let i = Self::find(v, k).ok()?;
                Some(edit(v, |v| v.remove(i).1))
            }
            SmallMap::Tree(t) => t.remove(k),
        };
        self.settle();
        out
    }
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        match self {
            SmallMap::One((k, val)) => {
                if !keep(k, val) {
                    *self = SmallMap::default();
                }
            }
            SmallMap::Vec(v) => {
                // No reallocation unless something goes (a boxed slice's
                // capacity is its length).
                edit(v, |v| v.retain_mut(|(k, val)| keep(k, val)));
                self.settle();
            }
            SmallMap::Tree(t) => t.retain(|k, val| keep(k, val)),
        }
    }
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn clear(&mut self) {
        *self = SmallMap::default();
    }
    /// Entries with keys in `r`, ascending.
    pub(crate) fn range<Q, R>(&self, r: R) -> Iter<'_, K, V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
        R: RangeBounds<Q>,
    {
        match self {
            SmallMap::One(e) => {
                let v = std::slice::from_ref(e);
                Iter::Vec(if r.contains(e.0.borrow()) { v } else { &v[..0] }.iter())
            }
            SmallMap::Vec(v) => {
                let lo = match r.start_bound() {
                    Bound::Unbounded => 0,
                    Bound::Included(s) => v.partition_point(|(k, _)| k.borrow() < s),
                    Bound::Excluded(s) => v.partition_point(|(k, _)| k.borrow() <= s),
                };
                let hi = match r.end_bound() {
                    Bound::Unbounded => v.len(),
                    Bound::Included(e) => v.partition_point(|(k, _)| k.borrow() <= e),
                    Bound::Excluded(e) => v.partition_point(|(k, _)| k.borrow() < e),
                };
                Iter::Vec(v[lo..hi.max(lo)].iter())
            }
            SmallMap::Tree(t) => Iter::Tree(t.range::<Q, R>(r)),
        }
    }
    pub(crate) fn iter(&self) -> Iter<'_, K, V> {
        match self {
            SmallMap::One(e) => Iter::Vec(std::slice::from_ref(e).iter()),
            SmallMap::Vec(v) => Iter::Vec(v.iter()),
            SmallMap::Tree(t) => Iter::Tree(t.range::<K, _>(..)),
        }
    }
    pub(crate) fn values(&self) -> impl DoubleEndedIterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }
}

impl<'a, K: Ord, V> IntoIterator for &'a SmallMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = Iter<'a, K, V>;
    fn into_iter(self) -> Iter<'a, K, V> {
        self.iter()
    }
}

impl<K: Ord, V> FromIterator<(K, V)> for SmallMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(i: I) -> Self {
        let mut m = SmallMap::default();
        for (k, v) in i {
            m.insert(k, v);
        }
        m
    }
}

impl<K, V, Q> std::ops::Index<&Q> for SmallMap<K, V>
where
    K: Ord + Borrow<Q>,
    Q: Ord + ?Sized,
{
    type Output = V;
    fn index(&self, k: &Q) -> &V {
        self.get(k).expect("no entry for the key in SmallMap")
    }
}

impl<K: Ord, V: PartialEq> PartialEq for SmallMap<K, V> {
    fn eq(&self, o: &Self) -> bool {
        self.len() == o.len() && self.iter().eq(o.iter())
    }
}
impl<K: Ord, V: Eq> Eq for SmallMap<K, V> {}

impl<K: Ord + fmt::Debug, V: fmt::Debug> fmt::Debug for SmallMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// As a `BTreeMap` serializes: a map, ascending.
impl<K: Ord + Serialize, V: Serialize> Serialize for SmallMap<K, V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // The length up front (bincode needs it; a tree's range iterator
        // does not tell it exactly).
        let mut m = s.serialize_map(Some(self.len()))?;
        for (k, v) in self.iter() {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl<'de, K, V> Deserialize<'de> for SmallMap<K, V>
where
    K: Ord + Deserialize<'de>,
    V: Deserialize<'de>,
{
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V_<K, V>(PhantomData<(K, V)>);
        impl<'de, K, V> Visitor<'de> for V_<K, V>
        where
            K: Ord + Deserialize<'de>,
            V: Deserialize<'de>,
        {
            type Value = SmallMap<K, V>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
                let n = a.size_hint().unwrap_or(0);
                if n <= SMALL {
                    // Read straight into the vector (no tree node built
                    // and dropped per map); sorted as written.
                    let mut v: Vec<(K, V)> = Vec::with_capacity(n);
                    while let Some(e) = a.next_entry()? {
                        v.push(e);
                    }
                    if v.len() <= SMALL && v.windows(2).all(|w| w[0].0 < w[1].0) {
                        let mut m = SmallMap::Vec(v.into_boxed_slice());
                        m.settle();
                        return Ok(m);
                    }
                    return Ok(v.into_iter().collect());
                }
                Ok(SmallMap::Tree(Box::new(packed_entries(a)?)))
            }
        }
        d.deserialize_map(V_(PhantomData))
    }
}

/// A vector of exactly its elements: a boxed slice (16 bytes, no spare
/// capacity), for lists that are mostly of one element and change rarely
/// (an akey's extents). Serialized as a `Vec<T>`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct ExactVec<T>(Box<[T]>);

impl<T> Default for ExactVec<T> {
    fn default() -> Self {
        ExactVec(Box::default())
    }
}

impl<T> ExactVec<T> {
    pub(crate) fn insert(&mut self, i: usize, x: T) {
        edit(&mut self.0, |v| {
            v.reserve_exact(1);
            v.insert(i, x)
        })
    }
    pub(crate) fn push(&mut self, x: T) {
        let n = self.0.len();
        self.insert(n, x)
    }
    pub(crate) fn retain(&mut self, keep: impl FnMut(&T) -> bool) {
        edit(&mut self.0, |v| v.retain(keep))
    }
}

impl<T> Deref for ExactVec<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.0
    }
}

impl<T> DerefMut for ExactVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.0
    }
}

impl<T> From<Vec<T>> for ExactVec<T> {
    fn from(v: Vec<T>) -> Self {
        ExactVec(v.into_boxed_slice())
    }
}

impl<T: fmt::Debug> fmt::Debug for ExactVec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<T: Serialize> Serialize for ExactVec<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for ExactVec<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Vec::deserialize(d).map(ExactVec::from)
    }
}

/// A list that is almost always empty (the punches of each level): one
/// pointer, null when empty (8 bytes where a `Vec` takes 24 in every
/// object, dkey and akey), its elements boxed behind it otherwise.
/// Serialized as a `Vec<T>`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct ThinVec<T>(Option<Box<ExactVec<T>>>);

impl<T> Default for ThinVec<T> {
    fn default() -> Self {
        ThinVec(None)
    }
}

impl<T> ThinVec<T> {
    pub(crate) fn push(&mut self, x: T) {
        self.0.get_or_insert_with(Box::default).push(x)
    }
    pub(crate) fn retain(&mut self, keep: impl FnMut(&T) -> bool) {
        if let Some(v) = &mut self.0 {
            v.retain(keep);
            if v.is_empty() {
                self.0 = None;
            }
        }
    }
}

impl<T> Deref for ThinVec<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.0.as_deref().map_or(&[], |v| v)
    }
}

impl<T> From<Vec<T>> for ThinVec<T> {
    fn from(v: Vec<T>) -> Self {
        ThinVec((!v.is_empty()).then(|| Box::new(ExactVec::from(v))))
    }
}

impl<T: fmt::Debug> fmt::Debug for ThinVec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self[..].fmt(f)
    }
}

impl<T: Serialize> Serialize for ThinVec<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self[..].serialize(s)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for ThinVec<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Vec::deserialize(d).map(ThinVec::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn small_map_behaves_as_a_btreemap() {
        // Keys from 24 values cross into the tree; from 2 (and the 100s the
        // loop adds) they stay with 0 to 3 entries: one in place, a vector.
        for keys in [24, 2] {
            small_map_against_btreemap(keys);
        }
    }

    fn small_map_against_btreemap(keys: u64) {
        let mut m: SmallMap<u64, u64> = SmallMap::default();
        let mut b: BTreeMap<u64, u64> = BTreeMap::new();
        // Pseudo-random inserts, replacements and removals across the switch.
        let mut x = 7u64;
        for i in 0..400 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let k = (x >> 33) % keys;
            match i % 5 {
                0..=2 => assert_eq!(m.insert(k, i), b.insert(k, i)),
                3 => assert_eq!(m.remove(&k), b.remove(&k)),
                _ if keys < 8 => {
                    m.clear();
                    b.clear();
                }
                _ => {
                    m.retain(|k, v| (k + *v) % 7 != 0);
                    b.retain(|k, v| (k + *v) % 7 != 0);
                }
            }
            assert!(m.iter().eq(b.iter()));
            assert_eq!(m.len(), b.len());
            for lo in [0, 1, 5, 11, 100, 101] {
                assert!(m.range(lo..).eq(b.range(lo..)));
                assert!(m.range(..=lo).rev().eq(b.range(..=lo).rev()));
                assert!(m
                    .range((Bound::Excluded(lo), Bound::Unbounded))
                    .eq(b.range((Bound::Excluded(lo), Bound::Unbounded))));
            }
            assert_eq!(m.get(&3), b.get(&3));
            *m.entry_or_default(k + 100) += 1;
            *b.entry(k + 100).or_default() += 1;
            // Same bytes as the BTreeMap, and back.
            let enc = bincode::serialize(&m).unwrap();
            assert_eq!(enc, bincode::serialize(&b).unwrap());
            let back: SmallMap<u64, u64> = bincode::deserialize(&enc).unwrap();
            assert_eq!(back, m);
        }
    }

    #[test]
    fn repacked_maps_keep_their_entries() {
        let want: BTreeMap<u64, u64> = (0..5000).map(|i| (i, i * 3)).collect();
        let mut m: SmallMap<u64, u64> = want.clone().into_iter().collect();
        m.repack();
        assert!(m.iter().map(|(k, v)| (*k, *v)).eq(want.into_iter()));
    }

    #[test]
    fn exact_and_thin_vectors_behave_and_serialize_as_vectors() {
        assert_eq!(std::mem::size_of::<ExactVec<u64>>(), 16);
        assert_eq!(std::mem::size_of::<ThinVec<u64>>(), 8);
        let mut v: Vec<u64> = Vec::new();
        let mut e: ExactVec<u64> = ExactVec::default();
        let mut t: ThinVec<u64> = ThinVec::default();
        for i in 0..40u64 {
            match i % 4 {
                0..=1 => {
                    v.push(i);
                    e.push(i);
                    t.push(i);
                }
                2 => {
                    let at = (i as usize * 7) % (v.len() + 1);
                    v.insert(at, i);
                    e.insert(at, i);
                    t.push(i);
                    t.retain(|&x| x != i);
                    t.push(i);
                }
                _ => {
                    v.retain(|x| x % 5 != 0);
                    e.retain(|x| x % 5 != 0);
                    t.retain(|x| x % 5 != 0);
                }
            }
            assert_eq!(&e[..], &v[..]);
            let enc = bincode::serialize(&v).unwrap();
            assert_eq!(bincode::serialize(&e).unwrap(), enc);
            assert_eq!(bincode::deserialize::<ExactVec<u64>>(&enc).unwrap(), e);
            let tv: Vec<u64> = t.to_vec();
            let enc = bincode::serialize(&tv).unwrap();
            assert_eq!(bincode::serialize(&t).unwrap(), enc);
            assert_eq!(bincode::deserialize::<ThinVec<u64>>(&enc).unwrap(), t);
        }
        t.retain(|_| false);
        assert!(t.0.is_none(), "an emptied thin vector holds no allocation");
        assert_eq!(
            bincode::deserialize::<ThinVec<u64>>(&[0; 8]).unwrap().0,
            None
        );
    }

    #[test]
    fn keys_serialize_as_vectors_and_order_as_bytes() {
        for len in [0, 1, 21, 22, 23, 300] {
            let v: Vec<u8> = (0..len).map(|i| i as u8 ^ 0x5a).collect();
            let k = Key::from(v.clone());
            assert_eq!(k.as_bytes(), &v[..]);
            let enc = bincode::serialize(&k).unwrap();
            assert_eq!(enc, bincode::serialize(&v).unwrap());
            assert_eq!(bincode::deserialize::<Key>(&enc).unwrap(), k);
            #[derive(Serialize, Deserialize, PartialEq, Debug)]
            struct Whole(#[serde(with = "bytes")] Vec<u8>);
            assert_eq!(bincode::serialize(&Whole(v.clone())).unwrap(), enc);
            assert_eq!(bincode::deserialize::<Whole>(&enc).unwrap(), Whole(v));
        }
        for len in [0, 1, 14, 15, 16, 300] {
            let v: Vec<u8> = (0..len).map(|i| i as u8 ^ 0x5a).collect();
            let k = ShortKey::from(v.clone());
            assert_eq!(k.as_bytes(), &v[..]);
            let enc = bincode::serialize(&k).unwrap();
            assert_eq!(enc, bincode::serialize(&v).unwrap());
            assert_eq!(bincode::deserialize::<ShortKey>(&enc).unwrap(), k);
        }
        assert!(ShortKey::from(b"ab".to_vec()) < ShortKey::from(b"abc".to_vec()));
        assert!(ShortKey::from(vec![0xff; 30]) > ShortKey::from(b"z".to_vec()));
        assert_eq!(std::mem::size_of::<ShortKey>(), 16);
        assert!(Key::new(b"ab") < Key::new(b"abc"));
        assert!(Key::new(&[0xff; 30]) > Key::new(b"z"));
        assert_eq!(std::mem::size_of::<Key>(), 24);
        // A map of one entry holds it in place, in no more room than the
        // entry (its form rides in the key's spare values); two make a vector.
        let mut m: SmallMap<Key, u64> = SmallMap::default();
        m.insert(Key::new(b"inode"), 1);
        assert!(matches!(m, SmallMap::One(_)));
        assert_eq!(std::mem::size_of::<SmallMap<Key, u64>>(), 32);
        m.insert(Key::new(b"size"), 2);
        assert!(matches!(&m, SmallMap::Vec(v) if v.len() == 2));
        m.remove(&Key::new(b"inode"));
        assert!(matches!(m, SmallMap::One(_)));
        m.retain(|_, _| false);
        assert!(matches!(&m, SmallMap::Vec(v) if v.is_empty()));
    }
}
