//! One stored value ([`Version`]) and where its bytes are ([`Payload`]), in
//! their compact in-RAM form (issue 19, point 7): every file costs at least
//! two of them (its directory entry and its data), so each byte here is a
//! byte per file.
//!
//! - A version is 56 bytes (it was 80): the SCM charge is a `u32` and the
//!   "client sent a CRC" flag rides in its top bit; a one-element box of
//!   versions then fits a 64-byte malloc chunk (a chunk is the size plus
//!   8, in steps of 16).
//! - Inline bytes are a boxed slice (no spare capacity, 16 bytes).
//! - A device run keeps the checksum of a one-chunk value (the small files
//!   whose data goes to the device) inline instead of in a vector of its
//!   own, and its block count as a `u32`: values are at most
//!   `MAX_IO_BYTES` (64 MiB, 16 Ki blocks).
//!
//! Checkpoints and WAL records keep the shape these had before, field for
//! field ([`DevExtent`] and the private `VersionWire`): the serde impls
//! below write and read exactly that, so either engine reads the other's
//! (pinned by `index::tests::checkpoints_keep_their_shape_across_the_compact_trees`).

use crate::compact::{bytes, ExactVec};
use serde::de::{Error as _, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::num::NonZeroU32;

/// A run of blocks holding one value, as checkpoints and WAL records carry
/// it (and as it was held in RAM before [`DevRun`]).
#[derive(Deserialize)]
struct DevExtent {
    block: u64,
    nblocks: u64,
    /// CRC32C of each chunk of the value (the last chunk may be short); the
    /// chunk size is the device's (`Superblock::csum_chunk`, 4 KiB).
    csums: Vec<u32>,
}

/// A run of blocks in the target's data region holding one value, with
/// the CRC32C of each chunk of it (the chunk size is the device's,
/// `Superblock::csum_chunk`, 4 KiB; the last chunk may be short). 24 bytes.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct DevRun {
    pub block: u64,
    /// Not zero: a value on the device takes a block at least (and the
    /// zero left free tells [`Payload`]'s variants apart at no cost).
    nblocks: NonZeroU32,
    /// The only checksum, when there is exactly one (`more` is `None`).
    csum: u32,
    /// All the checksums, when there are not exactly one (values larger
    /// than a chunk): boxed twice to keep this pointer thin.
    #[allow(clippy::box_collection, clippy::redundant_allocation)]
    more: Option<Box<Box<[u32]>>>,
}

impl DevRun {
    /// `None` for a run of no block or of 2^32 blocks or more (16 TiB: no
    /// value is; they are at most `MAX_IO_BYTES`).
    pub(crate) fn new(block: u64, nblocks: u64, csums: Vec<u32>) -> Option<DevRun> {
        let nblocks = NonZeroU32::new(u32::try_from(nblocks).ok()?)?;
        let (csum, more) = match csums[..] {
            [c] => (c, None),
            _ => (0, Some(Box::new(csums.into_boxed_slice()))),
        };
        Some(DevRun {
            block,
            nblocks,
            csum,
            more,
        })
    }
    pub(crate) fn nblocks(&self) -> u64 {
        u64::from(self.nblocks.get())
    }
    /// The checksum of each chunk.
    pub(crate) fn csums(&self) -> &[u32] {
        match &self.more {
            None => std::slice::from_ref(&self.csum),
            Some(m) => m,
        }
    }
}

impl fmt::Debug for DevRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DevRun")
            .field("block", &self.block)
            .field("nblocks", &self.nblocks())
            .field("csums", &self.csums())
            .finish()
    }
}

/// Where a value's bytes are. 24 bytes (the variants share the space).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Payload {
    Inline(Box<[u8]>),
    Device(DevRun),
}

/// [`DevExtent`]'s shape, borrowed from a [`DevRun`].
#[derive(Serialize)]
#[serde(rename = "DevExtent")]
struct DevExtentRef<'a> {
    block: u64,
    nblocks: u64,
    csums: &'a [u32],
}

/// Bytes serialized as `compact::bytes` does (a length, then the bytes).
struct BytesRef<'a>(&'a [u8]);

impl Serialize for BytesRef<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        bytes::serialize(self.0, s)
    }
}

/// As the enum it was: `Inline(Vec<u8>)` (read whole, `compact::bytes`)
/// or `Device(DevExtent)`.
impl Serialize for Payload {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Payload::Inline(b) => s.serialize_newtype_variant("Payload", 0, "Inline", &BytesRef(b)),
            Payload::Device(d) => s.serialize_newtype_variant(
                "Payload",
                1,
                "Device",
                &DevExtentRef {
                    block: d.block,
                    nblocks: d.nblocks(),
                    csums: d.csums(),
                },
            ),
        }
    }
}

/// The serialized shape of [`Payload`].
#[derive(Deserialize)]
#[serde(rename = "Payload")]
enum PayloadWire {
    Inline(#[serde(with = "bytes")] Vec<u8>),
    Device(DevExtent),
}

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Payload, D::Error> {
        Ok(match PayloadWire::deserialize(d)? {
            PayloadWire::Inline(v) => Payload::Inline(v.into_boxed_slice()),
            PayloadWire::Device(e) => {
                Payload::Device(DevRun::new(e.block, e.nblocks, e.csums).ok_or_else(|| {
                    D::Error::custom(format!("a device run of {} blocks", e.nblocks))
                })?)
            }
        })
    }
}

/// Bit of [`Version::scm_crc`] set when the client sent a CRC.
const HAS_CRC: u32 = 1 << 31;

/// One version of a value. 56 bytes.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Version {
    pub epoch: u64,
    /// ARRAY: byte offset of the extent; SINGLE: 0.
    pub offset: u64,
    pub len: u64,
    pub payload: Payload,
    /// The client's CRC32C of the value (see [`Version::crc`]).
    crc: u32,
    /// The SCM charged for this record (kept so removal refunds exactly;
    /// under 2^31: a record's keys come in a request frame of at most
    /// 4 MiB and its inline bytes are under 4 KiB), and [`HAS_CRC`].
    scm_crc: u32,
}

impl Version {
    pub(crate) fn new(
        epoch: u64,
        offset: u64,
        len: u64,
        crc: Option<u32>,
        payload: Payload,
        scm: u64,
    ) -> Version {
        // Saturated rather than wrapped should one ever exceed the bound:
        // the charge and its refund stay equal (both read this field).
        let scm = u32::try_from(scm).unwrap_or(u32::MAX).min(HAS_CRC - 1);
        Version {
            epoch,
            offset,
            len,
            payload,
            crc: crc.unwrap_or(0),
            scm_crc: scm | if crc.is_some() { HAS_CRC } else { 0 },
        }
    }
    /// The client's CRC32C of the value, when it sent one.
    pub(crate) fn crc(&self) -> Option<u32> {
        (self.scm_crc & HAS_CRC != 0).then_some(self.crc)
    }
    /// SCM charged for this record.
    pub(crate) fn scm(&self) -> u64 {
        u64::from(self.scm_crc & !HAS_CRC)
    }
}

impl fmt::Debug for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Version")
            .field("epoch", &self.epoch)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("crc", &self.crc())
            .field("payload", &self.payload)
            .field("scm", &self.scm())
            .finish()
    }
}

/// The serialized shape of [`Version`] (its fields before it was compact).
#[derive(Serialize, Deserialize)]
#[serde(rename = "Version")]
struct VersionWire<P> {
    epoch: u64,
    offset: u64,
    len: u64,
    crc: Option<u32>,
    payload: P,
    scm: u64,
}

impl Serialize for Version {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        VersionWire {
            epoch: self.epoch,
            offset: self.offset,
            len: self.len,
            crc: self.crc(),
            payload: &self.payload,
            scm: self.scm(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Version, D::Error> {
        let w = VersionWire::<Payload>::deserialize(d)?;
        Ok(Version::new(
            w.epoch, w.offset, w.len, w.crc, w.payload, w.scm,
        ))
    }
}

/// The single values of an akey, one per epoch, ascending: a vector of
/// exactly its versions (each keeps its epoch), not a map keyed by a copy of
/// it. Serialized as the map from epoch to version it was.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct Singles(ExactVec<Version>);

impl Singles {
    /// The newest version at or below epoch `r`.
    pub(crate) fn at(&self, r: u64) -> Option<&Version> {
        self.0[..self.0.partition_point(|v| v.epoch <= r)].last()
    }
    /// Add `v`; the version of the same epoch it replaces.
    pub(crate) fn insert(&mut self, v: Version) -> Option<Version> {
        let i = self.0.partition_point(|x| x.epoch < v.epoch);
        match self.0.get(i) {
            Some(x) if x.epoch == v.epoch => Some(std::mem::replace(&mut self.0[i], v)),
            _ => {
                self.0.insert(i, v);
                None
            }
        }
    }
    pub(crate) fn retain(&mut self, keep: impl FnMut(&Version) -> bool) {
        self.0.retain(keep)
    }
    pub(crate) fn epochs(&self) -> impl DoubleEndedIterator<Item = u64> + '_ {
        self.0.iter().map(|v| v.epoch)
    }
}

impl std::ops::Deref for Singles {
    type Target = [Version];
    fn deref(&self) -> &[Version] {
        &self.0
    }
}

impl fmt::Debug for Singles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|v| (v.epoch, v)))
            .finish()
    }
}

impl Serialize for Singles {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|v| (v.epoch, v)))
    }
}

impl<'de> Deserialize<'de> for Singles {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Singles, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Singles;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map from epoch to version")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Singles, A::Error> {
                // The hint comes from the data: reserve no more than a bounded start.
                let mut v: Vec<Version> = Vec::with_capacity(a.size_hint().unwrap_or(0).min(64));
                while let Some((e, x)) = a.next_entry::<u64, Version>()? {
                    if e != x.epoch || v.last().is_some_and(|p| p.epoch >= e) {
                        return Err(A::Error::custom(format!(
                            "a single value of epoch {} under key {e}, after {:?}",
                            x.epoch,
                            v.last().map(|p| p.epoch)
                        )));
                    }
                    v.push(x);
                }
                Ok(Singles(ExactVec::from(v)))
            }
        }
        d.deserialize_map(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_compact() {
        assert_eq!(std::mem::size_of::<DevRun>(), 24);
        assert_eq!(std::mem::size_of::<Payload>(), 24);
        assert_eq!(std::mem::size_of::<Version>(), 56);
    }

    #[test]
    fn singles_keep_one_version_per_epoch_and_serialize_as_the_map_they_were() {
        let v = |e: u64, b: u8| Version::new(e, 0, 1, None, Payload::Inline(Box::new([b])), 9);
        let mut s = Singles::default();
        assert!(s.insert(v(20, 1)).is_none());
        assert!(s.insert(v(10, 2)).is_none());
        assert!(s.insert(v(30, 3)).is_none());
        // Same epoch: replaced in place.
        assert_eq!(s.insert(v(20, 4)), Some(v(20, 1)));
        assert_eq!(s.epochs().collect::<Vec<_>>(), vec![10, 20, 30]);
        assert_eq!(s.at(25), Some(&v(20, 4)));
        assert_eq!(s.at(30), Some(&v(30, 3)));
        assert_eq!(s.at(9), None);
        let map: std::collections::BTreeMap<u64, Version> =
            s.iter().map(|x| (x.epoch, x.clone())).collect();
        let enc = bincode::serialize(&s).unwrap();
        assert_eq!(enc, bincode::serialize(&map).unwrap());
        assert!(bincode::deserialize::<Singles>(&enc).unwrap() == s);
        // A version under another epoch's key is refused, not misfiled.
        let bad: std::collections::BTreeMap<u64, Version> = [(11, v(10, 2))].into();
        let e = bincode::deserialize::<Singles>(&bincode::serialize(&bad).unwrap());
        assert!(e.unwrap_err().to_string().contains("epoch 10 under key 11"));
        s.retain(|x| x.epoch != 20);
        assert_eq!(s.epochs().collect::<Vec<_>>(), vec![10, 30]);
    }

    #[test]
    fn device_runs_keep_every_checksum() {
        for csums in [vec![], vec![7], vec![1, 2], (0..256).collect()] {
            let d = DevRun::new(9, 3, csums.clone()).unwrap();
            assert_eq!((d.block, d.nblocks(), d.csums()), (9, 3, &csums[..]));
        }
        assert!(DevRun::new(9, 0, vec![1]).is_none());
        assert!(DevRun::new(9, 1 << 32, vec![1]).is_none());
        let v = Version::new(1, 2, 3, Some(0), Payload::Inline(Box::new([1, 2, 3])), 99);
        assert_eq!((v.crc(), v.scm()), (Some(0), 99));
        let v = Version::new(1, 2, 3, None, Payload::Inline(Box::new([1, 2, 3])), 99);
        assert_eq!((v.crc(), v.scm()), (None, 99));
    }
}
