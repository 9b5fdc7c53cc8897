//! What a target answers, in its own terms; the engine turns it into the
//! protobuf response on the way out.

use super::types::{ChangedKey, Dtx, ValueKind};

/// Where a scan for the last dkey whose akey has a non-zero size ended
/// ([`Answer::Last`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LastSized {
    /// That dkey, and the size.
    Found { dkey: Vec<u8>, size: u64 },
    /// No such dkey before the asked bound.
    Nothing,
    /// None among the [`crate::LAST_SCAN_MAX`] dkeys scanned: ask again
    /// before this one, the last scanned.
    Below(Vec<u8>),
}

/// One iod of a fetch as read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FetchedValue {
    /// 0, or a negative errno (`-ENOENT`: no such single value).
    pub status: i32,
    /// Bytes of this value in the bulk.
    pub len: u64,
    /// A single value's size; an array's highest byte written + 1.
    pub size: u64,
    /// CRC32C of the bytes returned, for values written with one.
    pub crc: Option<u32>,
    /// Nothing visible at the epoch read (zeros written are not absence).
    pub absent: bool,
    /// The newest epoch among the versions read, or of the punch hiding
    /// older ones if later (0: none).
    pub epoch: u64,
}

/// What a shard knows of a transaction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DtxState {
    /// Never prepared here (or forgotten long after).
    #[default]
    Unknown,
    Prepared,
    Committed,
    Aborted,
}

/// A transaction held prepared here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DtxPending {
    pub dtx: Dtx,
    pub age_ms: u64,
    /// This shard holds fewer of its changes than its shards list names
    /// for it: it can only be aborted.
    pub incomplete: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    Value,
    PunchObject,
    PunchDkey,
    PunchAkey,
}

/// A version or a punch of one dkey, as a reintegration copies it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub kind: RecordKind,
    pub epoch: u64,
    /// A value's or an akey punch's akey (empty otherwise).
    pub akey: Vec<u8>,
    /// A value's kind (`Single` for punches).
    pub value_kind: ValueKind,
    /// A value's extent (an array's; a single value's length at 0).
    pub offset: u64,
    pub len: u64,
}

/// A successful answer's body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Nothing to say but success (updates, punches, flushes, decisions).
    Done,
    /// One value per iod, in iod order (their bytes in the bulk).
    Fetch(Vec<FetchedValue>),
    List {
        keys: Vec<Vec<u8>>,
        anchor: Vec<u8>,
        done: bool,
    },
    /// `absent`: nothing visible (size 0 is then not a written size).
    Size {
        size: u64,
        absent: bool,
    },
    /// The last dkey (before the asked bound) whose akey has a non-zero size.
    Last(LastSized),
    Changed {
        keys: Vec<ChangedKey>,
        done: bool,
    },
    Records(Vec<Record>),
    DtxState(DtxState),
    DtxPending(Vec<DtxPending>),
}
