//! Wire formats shared by the Peregrine engine and its clients.
//!
//! - [`mgmt`]: the management gRPC API (generated from `proto/mgmt.proto`).
//! - [`data`]: data-plane messages (generated from `proto/data.proto`).
//! - [`ms`]: the management service's persistent state (generated from
//!   `proto/ms_state.proto`; only the engine's management service uses it).
//! - [`acl`]: access control lists of pools and containers.
//! - [`handle`]: the capabilities data-plane requests carry.
//! - [`frame`]: the versioned, length-checked framing around data messages.
//! - [`oclass`]: object classes and 128-bit object ids.
//! - [`shm`]: the shared-memory data plane's handshake and mapping (one node).
//!
//! The `grpc` feature (on by default; off in the workspace's declaration,
//! so each crate asks for it) adds the services' tonic clients and servers
//! and the async framing. The storage core (`peregrine-vos`) builds without
//! it: neither gRPC nor an async runtime (`make lint` checks).

pub mod acl;
pub mod frame;
pub mod handle;
pub mod oclass;
pub mod shm;
pub mod size;

pub mod mgmt {
    include!(concat!(env!("OUT_DIR"), "/peregrine.mgmt.v1.rs"));
}

pub mod data {
    include!(concat!(env!("OUT_DIR"), "/peregrine.data.v1.rs"));
}

pub mod ms {
    include!(concat!(env!("OUT_DIR"), "/ms/peregrine.ms.v1.rs"));
}

pub use oclass::{ObjectClass, ObjectId, Redundancy};

/// Default control (management gRPC) port of an engine.
pub const DEFAULT_CONTROL_PORT: u16 = 10001;
/// Values at least this large go to the NVMe tier; smaller ones stay in the SCM tier.
pub const DATA_THRESHOLD: usize = 4096;
/// Most bytes one data-plane request may move: the total an update carries
/// (the sum of its iods' lengths) and the total a fetch asks for (its ARRAY
/// iods' lengths) and returns (with its SINGLE values' sizes). It is one
/// frame's bulk, which no reply can exceed on either transport. Engines
/// refuse more (`-EINVAL`, naming this limit and the size asked) before
/// allocating anything for it; the client library splits its I/O into
/// requests of at most [`frame::MAX_BULK`] bytes (`peregrine::object::MAX_IO`
/// per array request), so it never meets the limit.
pub const MAX_IO_BYTES: u64 = frame::MAX_BULK as u64;
/// Most objects one discard (`PunchReq.more`, besides its address's own)
/// names: engines refuse more (`-EINVAL`) before converting any, and one
/// request's WAL records stay a small batch.
pub const MAX_DISCARD_MORE: usize = 255;
/// Epoch meaning "the latest committed version".
pub const EPOCH_LATEST: u64 = u64::MAX;

/// The wall clock as an epoch (epochs are HLC values: nanoseconds with a
/// 16-bit logical counter), above every epoch an HLC issued before now.
pub fn epoch_now() -> u64 {
    let ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    ns | 0xFFFF
}

/// Parse a 16-byte UUID from the wire, naming the field on error.
pub fn uuid_from_bytes(field: &str, b: &[u8]) -> Result<uuid::Uuid, String> {
    uuid::Uuid::from_slice(b)
        .map_err(|_| format!("{field}: expected a 16-byte UUID, got {} bytes", b.len()))
}

/// Short text for a negative errno-style code, as the C ABI's strerror gives.
pub fn strerror(code: i32) -> String {
    match -code {
        0 => "success".into(),
        e if e == CSUM_ERRNO => "checksum mismatch: stored data is corrupt".into(),
        e => std::io::Error::from_raw_os_error(e).to_string(),
    }
}

/// errno used for checksum mismatches (EILSEQ, "illegal byte sequence").
pub const CSUM_ERRNO: i32 = libc::EILSEQ;
