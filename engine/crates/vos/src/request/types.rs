//! The requests a target takes, in its own terms: ids and enums rather
//! than the wire's bytes and integers. The engine builds them from the
//! protobuf messages, and refuses there what they cannot express (a
//! missing address, a UUID of the wrong length, an unknown enum value).

use crate::dtx::TxId;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// An object, as its client names it (the top 8 bits of `hi`: its class).
pub use peregrine_proto::ObjectId;

/// Where an I/O goes: one shard of one object on one target of one pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Address {
    pub pool: Uuid,
    pub cont: Uuid,
    pub oid: ObjectId,
    pub shard: u32,
    /// The target's index inside the engine.
    pub target: u32,
}

/// Where a request that names no object goes: a pool on one target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolAddress {
    pub pool: Uuid,
    pub target: u32,
}

impl From<Address> for PoolAddress {
    fn from(a: Address) -> PoolAddress {
        PoolAddress {
            pool: a.pool,
            target: a.target,
        }
    }
}

/// How a value is stored. Also the kind the WAL and checkpoints record
/// (serialized by variant index: the order is part of the format).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ValueKind {
    /// Replaced as a whole.
    #[default]
    Single,
    /// A byte array addressed by offset.
    Array,
}

/// What an iod addresses of its akey's value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IodKind {
    /// The whole single value.
    #[default]
    Single,
    /// Bytes `[offset, offset + len)` of an array. An update may ask that
    /// none of them changed since an epoch (compare-and-swap of EC
    /// stripes): refused whole with `-EBUSY` otherwise.
    Array {
        offset: u64,
        unchanged_since: Option<u64>,
    },
}

impl IodKind {
    pub fn value_kind(&self) -> ValueKind {
        match self {
            IodKind::Single => ValueKind::Single,
            IodKind::Array { .. } => ValueKind::Array,
        }
    }

    /// The array offset (0 for a single value).
    pub fn offset(&self) -> u64 {
        match *self {
            IodKind::Single => 0,
            IodKind::Array { offset, .. } => offset,
        }
    }
}

/// One value of a dkey an update writes or a fetch reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Iod {
    pub akey: Vec<u8>,
    pub kind: IodKind,
    /// Bytes of this value in the bulk (update) or wanted (fetch of an
    /// array; a single value returns whole).
    pub len: u64,
    /// CRC32C of the value's bytes, as the client computed it (update).
    pub crc: Option<u32>,
}

/// What a [`Condition`] expects of its akey.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// No visible (not punched) value at the latest epoch; else `-EEXIST`.
    Absent,
    /// No version and no punch newer than this epoch; else `-EBUSY`.
    UnchangedSince(u64),
    /// A visible value, the version written at exactly this epoch; else
    /// `-EBUSY` (also when nothing is there, whatever aggregation dropped).
    WrittenAt(u64),
}

/// A condition an update or punch needs on an akey of its dkey.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Condition {
    pub akey: Vec<u8>,
    pub expect: Expect,
}

/// The transaction an update or punch is part of: its id and its shards
/// as (rank, target), leader first, one entry per change sent to the shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dtx {
    pub id: TxId,
    pub shards: Vec<(u32, u32)>,
}

#[derive(Clone, Debug, Default)]
pub struct UpdateReq {
    pub addr: Address,
    pub epoch: u64,
    pub dkey: Vec<u8>,
    pub iods: Vec<Iod>,
    /// Fail with `-EEXIST`, nothing stored, if any akey has a visible value.
    pub insert_only: bool,
    /// Acknowledge once flushed from the device's volatile write cache.
    pub sync: bool,
    pub dtx: Option<Dtx>,
    pub conditions: Vec<Condition>,
}

#[derive(Clone, Debug, Default)]
pub struct FetchReq {
    pub addr: Address,
    /// The latest version at or below this epoch is read.
    pub epoch: u64,
    pub dkey: Vec<u8>,
    pub iods: Vec<Iod>,
}

#[derive(Clone, Debug, Default)]
pub struct PunchReq {
    pub addr: Address,
    pub epoch: u64,
    /// Empty: the whole object shard.
    pub dkey: Vec<u8>,
    /// Empty: the whole dkey.
    pub akeys: Vec<Vec<u8>>,
    pub sync: bool,
    pub dtx: Option<Dtx>,
    pub conditions: Vec<Condition>,
    /// More whole objects of `addr`'s container on its target, punched
    /// alike (discards of removed files): only with an empty `dkey`, no
    /// `dtx` and no `conditions`.
    pub more: Vec<ShardId>,
}

/// One shard of an object, on the target a request names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardId {
    pub oid: ObjectId,
    pub shard: u32,
}

#[derive(Clone, Debug, Default)]
pub struct ListReq {
    pub addr: Address,
    pub epoch: u64,
    /// Empty: list the dkeys; else the akeys of this dkey.
    pub dkey: Vec<u8>,
    /// Resume after this key; empty to start.
    pub anchor: Vec<u8>,
    /// 0: the default page.
    pub max: u32,
}

#[derive(Clone, Debug, Default)]
pub struct QuerySizeReq {
    pub addr: Address,
    pub epoch: u64,
    pub dkey: Vec<u8>,
    pub akey: Vec<u8>,
    /// `Some(before)`: `dkey` is not read; answer the last dkey before
    /// `before` (empty: the last of all) whose `akey` has a non-zero size
    /// ([`crate::Answer::Last`]).
    pub last: Option<Vec<u8>>,
}

/// Make every update acknowledged before it survive a power cut.
#[derive(Clone, Debug, Default)]
pub struct FlushReq {
    pub addr: PoolAddress,
}

/// A dkey of a pool, as reintegration lists them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChangedKey {
    pub cont: Uuid,
    pub oid: ObjectId,
    pub shard: u32,
    pub dkey: Vec<u8>,
}

/// The dkeys of a pool on a target changed above `since`.
#[derive(Clone, Debug, Default)]
pub struct ListChangedReq {
    pub addr: PoolAddress,
    pub since: u64,
    /// Resume after this key; `None` to start.
    pub anchor: Option<ChangedKey>,
    /// 0: 1024; capped at 4096.
    pub max: u32,
}

/// The versions and punches of one dkey above `since`.
#[derive(Clone, Debug, Default)]
pub struct ListRecordsReq {
    pub addr: Address,
    pub dkey: Vec<u8>,
    pub since: u64,
}

/// Record the outcome of transactions on one shard.
#[derive(Clone, Debug, Default)]
pub struct DtxDecideReq {
    pub addr: PoolAddress,
    pub ids: Vec<TxId>,
    /// False: abort.
    pub commit: bool,
    /// The leader refuses to commit a transaction it never saw.
    pub leader: bool,
}

/// What a shard knows of a transaction; with `resolve`, the answer is final.
#[derive(Clone, Debug, Default)]
pub struct DtxQueryReq {
    pub addr: PoolAddress,
    pub id: TxId,
    pub resolve: bool,
}

/// The transactions held prepared for at least `older_than_ms`.
#[derive(Clone, Debug, Default)]
pub struct DtxPendingReq {
    pub addr: PoolAddress,
    pub older_than_ms: u64,
    /// 0: 256.
    pub max: u32,
}
