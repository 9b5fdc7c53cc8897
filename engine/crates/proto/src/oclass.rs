//! Object classes and object ids.
//!
//! An object id is 128 bits; the top 8 bits of `hi` carry the object class,
//! so any holder of an id can compute its layout without a lookup (as DAOS).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Redundancy {
    /// Plain striping, one copy.
    None,
    /// `n` full copies on distinct engines.
    Replicas(u32),
    /// Reed-Solomon with `data` data cells and `parity` parity cells.
    ErasureCode { data: u32, parity: u32 },
}

/// How an object spreads over a pool's targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ObjectClass {
    S1,
    S2,
    S4,
    /// Striped over every target of the pool.
    SX,
    Rp2G1,
    Rp3G1,
    /// Two replicas, groups over every target.
    Rp2GX,
    Ec2P1G1,
    Ec4P2G1,
    Ec2P1GX,
}

pub const ALL_CLASSES: [ObjectClass; 10] = [
    ObjectClass::S1,
    ObjectClass::S2,
    ObjectClass::S4,
    ObjectClass::SX,
    ObjectClass::Rp2G1,
    ObjectClass::Rp3G1,
    ObjectClass::Rp2GX,
    ObjectClass::Ec2P1G1,
    ObjectClass::Ec4P2G1,
    ObjectClass::Ec2P1GX,
];

/// Cell size of erasure-coded objects.
pub const EC_CELL_SIZE: u64 = 128 * 1024;

/// Number of groups meaning "as many as the pool's targets allow".
pub const GROUPS_MAX: u32 = u32::MAX;

impl ObjectClass {
    pub fn name(self) -> &'static str {
        match self {
            ObjectClass::S1 => "S1",
            ObjectClass::S2 => "S2",
            ObjectClass::S4 => "S4",
            ObjectClass::SX => "SX",
            ObjectClass::Rp2G1 => "RP_2G1",
            ObjectClass::Rp3G1 => "RP_3G1",
            ObjectClass::Rp2GX => "RP_2GX",
            ObjectClass::Ec2P1G1 => "EC_2P1G1",
            ObjectClass::Ec4P2G1 => "EC_4P2G1",
            ObjectClass::Ec2P1GX => "EC_2P1GX",
        }
    }

    /// The id stored in the top byte of an object id.
    pub fn id(self) -> u8 {
        ALL_CLASSES.iter().position(|c| *c == self).unwrap() as u8 + 1
    }

    pub fn from_id(id: u8) -> Option<Self> {
        ALL_CLASSES.get((id as usize).checked_sub(1)?).copied()
    }

    pub fn redundancy(self) -> Redundancy {
        match self {
            ObjectClass::S1 | ObjectClass::S2 | ObjectClass::S4 | ObjectClass::SX => {
                Redundancy::None
            }
            ObjectClass::Rp2G1 | ObjectClass::Rp2GX => Redundancy::Replicas(2),
            ObjectClass::Rp3G1 => Redundancy::Replicas(3),
            ObjectClass::Ec2P1G1 | ObjectClass::Ec2P1GX => {
                Redundancy::ErasureCode { data: 2, parity: 1 }
            }
            ObjectClass::Ec4P2G1 => Redundancy::ErasureCode { data: 4, parity: 2 },
        }
    }

    /// Shards in one redundancy group.
    pub fn group_size(self) -> u32 {
        match self.redundancy() {
            Redundancy::None => 1,
            Redundancy::Replicas(n) => n,
            Redundancy::ErasureCode { data, parity } => data + parity,
        }
    }

    /// Number of groups; [`GROUPS_MAX`] means one per `group_size` targets.
    pub fn groups(self) -> u32 {
        match self {
            ObjectClass::S1 => 1,
            ObjectClass::S2 => 2,
            ObjectClass::S4 => 4,
            ObjectClass::SX | ObjectClass::Rp2GX | ObjectClass::Ec2P1GX => GROUPS_MAX,
            _ => 1,
        }
    }

    /// Engine failures an object of this class survives.
    pub fn fault_tolerance(self) -> u32 {
        match self.redundancy() {
            Redundancy::None => 0,
            Redundancy::Replicas(n) => n - 1,
            Redundancy::ErasureCode { parity, .. } => parity,
        }
    }

    /// The class of a POSIX container's directories when it names none,
    /// for files of this class: one group, replicated to survive as many
    /// engine failures as the files do (directories hold small entries:
    /// replicas, not erasure codes, as DAOS picks a directory class from
    /// the redundancy factor). Unreplicated files get `S1` directories.
    pub fn default_dir_class(self) -> ObjectClass {
        match self.fault_tolerance() {
            0 => ObjectClass::S1,
            1 => ObjectClass::Rp2G1,
            _ => ObjectClass::Rp3G1,
        }
    }
}

impl fmt::Display for ObjectClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownClass(pub String);
impl fmt::Display for UnknownClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let known: Vec<&str> = ALL_CLASSES.iter().map(|c| c.name()).collect();
        write!(
            f,
            "unknown object class {:?} (known: {})",
            self.0,
            known.join(", ")
        )
    }
}
impl std::error::Error for UnknownClass {}

impl FromStr for ObjectClass {
    type Err = UnknownClass;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let norm = s.trim().to_ascii_uppercase();
        ALL_CLASSES
            .iter()
            .find(|c| c.name() == norm)
            .copied()
            .ok_or_else(|| UnknownClass(s.to_string()))
    }
}

/// A 128-bit object id; the class lives in the top byte of `hi`.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct ObjectId {
    pub hi: u64,
    pub lo: u64,
}

impl ObjectId {
    /// Build an id of class `class` from a user-chosen 120-bit number.
    pub fn new(class: ObjectClass, hi: u64, lo: u64) -> Self {
        ObjectId {
            hi: (hi & 0x00FF_FFFF_FFFF_FFFF) | ((class.id() as u64) << 56),
            lo,
        }
    }

    pub fn class(&self) -> Result<ObjectClass, UnknownClass> {
        let id = (self.hi >> 56) as u8;
        ObjectClass::from_id(id).ok_or_else(|| UnknownClass(format!("class id {id}")))
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}.{:x}", self.hi, self.lo)
    }
}

impl FromStr for ObjectId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (hi, lo) = s
            .split_once('.')
            .ok_or_else(|| format!("object id {s:?}: expected HI.LO in hex"))?;
        let parse =
            |x: &str| u64::from_str_radix(x, 16).map_err(|e| format!("object id {s:?}: {e}"));
        Ok(ObjectId {
            hi: parse(hi)?,
            lo: parse(lo)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_names_round_trip() {
        for c in ALL_CLASSES {
            assert_eq!(c.name().parse::<ObjectClass>().unwrap(), c);
            assert_eq!(ObjectClass::from_id(c.id()), Some(c));
            assert_eq!(ObjectId::new(c, 7, 9).class().unwrap(), c);
        }
        let err = "RP_9G9".parse::<ObjectClass>().unwrap_err().to_string();
        assert!(err.contains("RP_9G9") && err.contains("EC_2P1G1"), "{err}");
    }

    #[test]
    fn directories_survive_what_the_files_survive() {
        for c in ALL_CLASSES {
            let d = c.default_dir_class();
            assert_eq!(d.groups(), 1, "{c}: {d}");
            assert!(
                d.fault_tolerance() >= c.fault_tolerance(),
                "{c} files, {d} directories"
            );
            assert!(d.group_size() <= c.group_size().max(1), "{c}: {d}");
        }
        assert_eq!(ObjectClass::SX.default_dir_class(), ObjectClass::S1);
        assert_eq!(ObjectClass::Ec2P1GX.default_dir_class(), ObjectClass::Rp2G1);
        assert_eq!(ObjectClass::Ec4P2G1.default_dir_class(), ObjectClass::Rp3G1);
    }
}
